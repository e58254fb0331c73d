/* One pass over a file-system root: sysfs CPU, cache, NUMA node and PCI facts into flat arrays.
 *
 * Every open is relative to a descriptor of the root, attribute files are opened O_NOFOLLOW, and
 * the only links followed on purpose (PCI device entries, cpuN/cpufreq) are resolved one level,
 * confined to the root: a dump cannot make the scan read the host, and a link loop costs one
 * failed open.  A file that cannot be used becomes an error record; the scan goes on.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "scan_ctx.h"

#define DIR_BUF 16384
#define MAX_CACHES_PER_CPU 64
#define MAX_HUGEPAGE_SIZES 64
#define MAX_PCI 65536
#define SMALL_FILE 4096

/* ---- memory ---------------------------------------------------------------------------- */

static int grow(struct scan_ctx *ctx, void **arr, uint32_t *cap, uint64_t need, size_t elsz)
{
    uint64_t ncap;
    void *p;

    if (ctx->oom)
        return -1;
    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    if (ncap > UINT32_MAX / 2 || (p = realloc(*arr, ncap * elsz)) == NULL) {
        ctx->oom = 1;
        return -1;
    }
    *arr = p;
    *cap = (uint32_t)ncap;
    return 0;
}

#define GROW(ctx, field, count, capf, extra)                                                      \
    grow((ctx), (void **)&(ctx)->pub.field, &(ctx)->capf, (uint64_t)(ctx)->pub.count + (extra),  \
         sizeof *(ctx)->pub.field)

int32_t scan_add_string(struct scan_ctx *ctx, const char *s, size_t len)
{
    int32_t off = (int32_t)ctx->pub.nstrings;

    if (GROW(ctx, strings, nstrings, cap_strings, len + 1))
        return 0; /* "" */
    memcpy(ctx->pub.strings + off, s, len);
    ctx->pub.strings[off + (int32_t)len] = '\0';
    ctx->pub.nstrings += (uint32_t)len + 1;
    return off;
}

void scan_add_error(struct scan_ctx *ctx, int code, const char *dir, const char *name)
{
    char path[1024];
    int n;

    if (GROW(ctx, errors, nerrors, cap_errors, 1))
        return;
    if (name && *dir)
        n = snprintf(path, sizeof path, "%s/%s", dir, name);
    else
        n = snprintf(path, sizeof path, "%s", name ? name : dir);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof path)
        n = sizeof path - 1;
    ctx->pub.errors[ctx->pub.nerrors].code = code;
    ctx->pub.errors[ctx->pub.nerrors].path = scan_add_string(ctx, path, (size_t)n);
    ctx->pub.nerrors++;
}

static uint64_t hash_words(const uint64_t *w, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

/* Put a set in the word pool, reusing the words of an identical set already there. */
static topo_set_t add_set(struct scan_ctx *ctx, const uint64_t *w, uint32_t n)
{
    topo_set_t absent = {TOPO_ABSENT, 0}, empty = {0, 0};
    uint64_t h;
    uint32_t i;

    if (n == 0)
        return empty;
    if (ctx->used_slots * 2 >= ctx->nslots) {
        uint32_t nn = ctx->nslots ? ctx->nslots * 2 : 256;
        struct set_slot *ns = calloc(nn, sizeof *ns);
        if (ns == NULL) {
            ctx->oom = 1;
            return absent;
        }
        for (i = 0; i < ctx->nslots; i++) {
            struct set_slot *s = &ctx->slots[i];
            uint32_t j;
            if (s->n == 0)
                continue;
            for (j = (uint32_t)s->hash & (nn - 1); ns[j].n; j = (j + 1) & (nn - 1))
                ;
            ns[j] = *s;
        }
        free(ctx->slots);
        ctx->slots = ns;
        ctx->nslots = nn;
    }
    h = hash_words(w, n);
    for (i = (uint32_t)h & (ctx->nslots - 1); ctx->slots[i].n; i = (i + 1) & (ctx->nslots - 1)) {
        struct set_slot *s = &ctx->slots[i];
        if (s->hash == h && s->n == n && !memcmp(ctx->pub.words + s->off, w, n * sizeof *w)) {
            topo_set_t found = {s->off, n};
            return found;
        }
    }
    if (GROW(ctx, words, nwords, cap_words, n))
        return absent;
    memcpy(ctx->pub.words + ctx->pub.nwords, w, n * sizeof *w);
    ctx->slots[i].hash = h;
    ctx->slots[i].off = (int32_t)ctx->pub.nwords;
    ctx->slots[i].n = n;
    ctx->used_slots++;
    ctx->pub.nwords += n;
    {
        topo_set_t made = {ctx->slots[i].off, n};
        return made;
    }
}

static int set_has(const struct scan_ctx *ctx, topo_set_t s, uint32_t cpu)
{
    if (s.off < 0 || cpu / 64 >= s.n)
        return 0;
    return (int)(ctx->pub.words[s.off + (int32_t)(cpu / 64)] >> (cpu % 64) & 1);
}

/* ---- files ----------------------------------------------------------------------------- */

#define WALK_MAX_LINKS 40         /* as the kernel's own limit on links in one lookup */
#define WALK_MAX_DEPTH 64
#define WALK_PATH 4096

/* Split the next component off *p (skipping slashes): its length, or 0 at the end. */
static size_t next_component(const char **p)
{
    size_t n = 0;

    while (**p == '/')
        (*p)++;
    while ((*p)[n] && (*p)[n] != '/')
        n++;
    return n;
}

/* The fallback for openat2's RESOLVE_IN_ROOT where the kernel lacks it (or a seccomp filter
 * refuses it): walk `rel` one component at a time, never letting the kernel follow a link, and
 * resolve each link ourselves as if the root were "/": an absolute target restarts at the root,
 * ".." stops at the root.  A dump's `sys -> /sys` therefore names the dump's own sys (a loop:
 * ELOOP), never the host's; magic links (/proc/self/fd/N) are text to resolve, never jumps. */
static int walk_in_root(int rootfd, const char *rel, int flags)
{
    char path[WALK_PATH], next[WALK_PATH], target[WALK_PATH];
    int fds[WALK_MAX_DEPTH];
    int depth = 0, links = 0, fd = -1, err = 0;
    const char *p;

    if (strlen(rel) >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(path, rel);
    p = path;
    for (;;) {
        int cur = depth ? fds[depth - 1] : rootfd, last;
        size_t n = next_component(&p);
        char comp[256];
        const char *rest;
        ssize_t tn;

        if (n == 0) { /* the path ends on the folder we stand in */
            fd = openat(cur, ".", (flags & ~O_NOFOLLOW) | O_CLOEXEC);
            err = fd < 0 ? errno : 0;
            break;
        }
        if (n >= sizeof comp) {
            err = ENAMETOOLONG;
            break;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        rest = p + n;
        p = rest;
        while (*rest == '/')
            rest++;
        last = *rest == '\0';
        if (strcmp(comp, ".") == 0)
            continue;
        if (strcmp(comp, "..") == 0) {
            if (depth > 0)
                close(fds[--depth]);
            continue;
        }
        if (last)
            fd = openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC);
        else
            fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0 && !last) {
            if (depth == WALK_MAX_DEPTH) {
                close(fd);
                err = ENAMETOOLONG;
                break;
            }
            fds[depth++] = fd;
            continue;
        }
        if (fd >= 0)
            break;
        err = errno;
        /* a link refused by O_NOFOLLOW (ELOOP, or ENOTDIR where a folder was asked for) */
        if ((err != ELOOP && err != ENOTDIR) || (last && flags & O_NOFOLLOW))
            break;
        tn = readlinkat(cur, comp, target, sizeof target - 1);
        if (tn < 0) {
            if (errno != EINVAL) /* EINVAL: not a link, the first error stands */
                err = errno;
            break;
        }
        target[tn] = '\0';
        if (++links > WALK_MAX_LINKS) {
            err = ELOOP;
            break;
        }
        if ((size_t)snprintf(next, sizeof next, "%s/%s", target, rest) >= sizeof next) {
            err = ENAMETOOLONG;
            break;
        }
        strcpy(path, next);
        p = path;
        err = 0;
        if (target[0] == '/')
            while (depth > 0)
                close(fds[--depth]);
    }
    while (depth > 0)
        close(fds[--depth]);
    if (err) {
        errno = err;
        return -1;
    }
    return fd;
}

/* The fallback for openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: every folder on the way is
 * opened O_NOFOLLOW, so any link on the path is refused (ELOOP), and ".." is refused (EXDEV). */
static int walk_beneath(int dirfd, const char *rel, int flags)
{
    int cur = dirfd, fd = -1, err = 0;
    const char *p = rel;

    for (;;) {
        size_t n = next_component(&p);
        char comp[256];
        const char *rest;

        if (n == 0) {
            fd = openat(cur, ".", (flags & ~O_NOFOLLOW) | O_CLOEXEC);
            err = fd < 0 ? errno : 0;
            break;
        }
        if (n >= sizeof comp) {
            err = ENAMETOOLONG;
            break;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        p += n;
        for (rest = p; *rest == '/'; rest++)
            ;
        if (strcmp(comp, "..") == 0) {
            err = EXDEV;
            break;
        }
        if (*rest == '\0') {
            fd = openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC);
            err = fd < 0 ? errno : 0;
            break;
        }
        fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            err = errno;
            /* O_DIRECTORY on a link says ENOTDIR: say what openat2 says, a link was refused */
            if (err == ENOTDIR) {
                struct stat st;
                if (fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
                    err = ELOOP;
            }
            break;
        }
        if (cur != dirfd)
            close(cur);
        cur = fd;
        fd = -1;
    }
    if (cur != dirfd)
        close(cur);
    if (err) {
        errno = err;
        return -1;
    }
    return fd;
}

static int open_in_root(struct scan_ctx *ctx, const char *rel, int flags)
{
    int fd;

    if (ctx->is_host)
        return openat(ctx->rootfd, rel, flags | O_CLOEXEC); /* the host's "/" needs no confinement */
    if (ctx->have_openat2) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = (uint64_t)(flags | O_CLOEXEC);
        how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
        fd = (int)syscall(SYS_openat2, ctx->rootfd, rel, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
            return fd;
        ctx->have_openat2 = 0; /* old kernel or a seccomp filter: walk the path ourselves */
    }
    return walk_in_root(ctx->rootfd, rel, flags);
}

static int read_fd(struct scan_ctx *ctx, int fd, size_t *len, int whole_stream)
{
    size_t total = 0;
    int err = 0;

    for (;;) {
        size_t want;
        ssize_t n;
        if (total + 1 >= ctx->bufcap) {
            char *nb;
            if (ctx->bufcap >= SCAN_READ_CAP) {
                err = EFBIG;
                break;
            }
            nb = realloc(ctx->buf, ctx->bufcap * 2);
            if (nb == NULL) {
                ctx->oom = 1;
                err = ENOMEM;
                break;
            }
            ctx->buf = nb;
            ctx->bufcap *= 2;
        }
        want = ctx->bufcap - 1 - total;
        n = read(fd, ctx->buf + total, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (n == 0)
            break;
        total += (size_t)n;
        if (!whole_stream && (size_t)n < want && total < SMALL_FILE)
            break;
        if (whole_stream == SCAN_FIRST_BLOCK) {
            ctx->buf[total] = '\0';
            if (strstr(ctx->buf, "\n\n"))
                break;
        }
    }
    if (!err && total == 0) {
        /* an empty read from a FIFO or device is not an empty attribute */
        struct stat st;
        if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode))
            err = EINVAL;
    }
    ctx->buf[total] = '\0';
    *len = total;
    return err;
}

/* Open a path below dirfd following no link at all: on a dump through openat2's
 * RESOLVE_NO_SYMLINKS when the path has folders in it (else walking it folder by folder),
 * O_NOFOLLOW on a lone name. */
static int open_rel(struct scan_ctx *ctx, int dirfd, const char *path, int flags)
{
    flags |= O_CLOEXEC | O_NOFOLLOW;
    if (ctx->is_host || !strchr(path, '/'))
        return openat(dirfd, path, flags);
    if (ctx->have_openat2) {
        struct open_how how;
        int fd;
        memset(&how, 0, sizeof how);
        how.flags = (uint64_t)flags;
        how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
        fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
            return fd;
        ctx->have_openat2 = 0;
    }
    return walk_beneath(dirfd, path, flags);
}

int scan_read(struct scan_ctx *ctx, int dirfd, const char *name, size_t *len, int whole_stream)
{
    int fd = open_rel(ctx, dirfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    int err;

    *len = 0;
    if (fd < 0)
        return errno;
    err = read_fd(ctx, fd, len, whole_stream);
    close(fd);
    return err;
}

int scan_read_root(struct scan_ctx *ctx, const char *rel, size_t *len, int whole_stream)
{
    int fd = open_in_root(ctx, rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    int err;

    *len = 0;
    if (fd < 0)
        return errno;
    err = read_fd(ctx, fd, len, whole_stream);
    close(fd);
    return err;
}

static int open_dir_at(int dirfd, const char *name)
{
    return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
}

typedef void (*entry_fn)(void *arg, const char *name, unsigned char type);

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* File systems whose getdents64 fills the buffer until the folder ends, so a reply with room
 * to spare is the last one (FUSE and network file systems may stop early: they get no shortcut). */
static int fills_dir_buffers(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return 0;
    switch ((unsigned long)sf.f_type) {
    case 0x62656572ul: /* sysfs */
    case 0x9fa0ul:     /* proc */
    case 0xef53ul:     /* ext2/3/4 */
    case 0x01021994ul: /* tmpfs */
    case 0x58465342ul: /* xfs */
    case 0x9123683eul: /* btrfs */
    case 0x794c7630ul: /* overlayfs */
        return 1;
    default:
        return 0;
    }
}

/* List a directory through getdents64, keeping fd usable for openat afterwards. */
static int list_dir(const struct scan_ctx *ctx, int fd, entry_fn fn, void *arg)
{
    char buf[DIR_BUF];
    for (;;) {
        long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
        int last;
        if (n < 0)
            return errno == EINTR ? 0 : errno;
        if (n == 0)
            return 0;
        /* room for another maximal entry left over: the folder has ended */
        last = ctx->dir_eof_hint && (size_t)n + sizeof(struct linux_dirent64) + 256 < sizeof buf;
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + pos);
            if (d->d_reclen == 0)
                return EIO;
            pos += d->d_reclen;
            if (d->d_name[0] == '.' &&
                (d->d_name[1] == '\0' || (d->d_name[1] == '.' && d->d_name[2] == '\0')))
                continue;
            fn(arg, d->d_name, d->d_type);
        }
        if (last)
            return 0;
    }
}

/* ---- text ------------------------------------------------------------------------------ */

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\0';
}

static void trim(const char **s, size_t *n)
{
    while (*n > 0 && is_blank((*s)[*n - 1]))
        (*n)--;
    while (*n > 0 && is_blank(**s)) {
        (*s)++;
        (*n)--;
    }
}

/* Whole text (after trimming) is one integer: decimal with optional sign, or 0x-prefixed hex. */
static int parse_int(const char *s, size_t n, int base16, int64_t *out)
{
    int neg = 0;
    uint64_t v = 0;
    size_t i = 0;

    trim(&s, &n);
    if (n == 0)
        return ENODATA;
    if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        i = 1;
    }
    if (n - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        base16 = 1;
        i += 2;
    }
    if (i == n)
        return EINVAL;
    for (; i < n; i++) {
        int d;
        char c = s[i];
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (base16 && c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (base16 && c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return EINVAL;
        if (v > (INT64_MAX - (uint64_t)d) / (base16 ? 16 : 10))
            return ERANGE;
        v = v * (base16 ? 16 : 10) + (uint64_t)d;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

/* A number file: 0 and *out set, ENOENT when absent (silent); any other problem is recorded. */
static int get_int(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name, int base16,
                   int64_t *out)
{
    size_t len;
    int err = scan_read(ctx, dirfd, name, &len, 0);

    *out = -1;
    if (err == 0)
        err = parse_int(ctx->buf, len, base16, out);
    if (err && err != ENOENT) {
        *out = -1;
        scan_add_error(ctx, err, dir, name);
    }
    return err;
}

static int32_t get_id(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name)
{
    int64_t v;
    if (get_int(ctx, dirfd, dir, name, 0, &v) || v < INT32_MIN || v > INT32_MAX)
        return -1;
    return (int32_t)v;
}

static int parse_set_text(struct scan_ctx *ctx, const char *text, size_t len, int mask, topo_set_t *out)
{
    size_t n;
    int err = mask ? topo_parse_cpumask(text, len, ctx->scratch, TOPO_MAX_WORDS, &n)
                   : topo_parse_cpulist(text, len, ctx->scratch, TOPO_MAX_WORDS, &n);
    if (err)
        return err;
    *out = add_set(ctx, ctx->scratch, (uint32_t)n);
    return 0;
}

/* A set from the first of `names` that exists (lists and masks alternate as the caller orders
 * them).  `present` is a bit per name from a directory listing, or ~0 to just try each. */
static topo_set_t get_set(struct scan_ctx *ctx, int dirfd, const char *dir, const char *const *names,
                          const int *is_mask, int count, uint32_t present)
{
    topo_set_t s = {TOPO_ABSENT, 0};

    for (int i = 0; i < count; i++) {
        size_t len;
        int err;
        if (!(present >> i & 1))
            continue;
        err = scan_read(ctx, dirfd, names[i], &len, 0);
        if (err == ENOENT)
            continue;
        if (err == 0)
            err = parse_set_text(ctx, ctx->buf, len, is_mask[i], &s);
        if (err == 0)
            return s;
        scan_add_error(ctx, err, dir, names[i]);
    }
    return s;
}

/* Like get_set for names under `prefix` ("topology/", "index2/"), trying first the name that
 * worked last time (*pref): sibling folders nearly always offer the same files. */
static topo_set_t get_set_pref(struct scan_ctx *ctx, int dirfd, const char *dir, const char *prefix,
                               const char *const *names, const int *is_mask, int count, int *pref)
{
    topo_set_t s = {TOPO_ABSENT, 0};

    for (int k = -1; k < count; k++) {
        char path[128];
        size_t len;
        int err, i = k < 0 ? *pref : k;
        if (k == *pref)
            continue;
        snprintf(path, sizeof path, "%s%s", prefix, names[i]);
        err = scan_read(ctx, dirfd, path, &len, 0);
        if (err == ENOENT)
            continue;
        if (err == 0)
            err = parse_set_text(ctx, ctx->buf, len, is_mask[i], &s);
        if (err == 0) {
            *pref = i;
            return s;
        }
        scan_add_error(ctx, err, dir, path);
    }
    return s;
}

static topo_set_t get_list(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name)
{
    static const int no_mask[1] = {0};
    return get_set(ctx, dirfd, dir, &name, no_mask, 1, 1);
}

static topo_set_t get_list_or_mask(struct scan_ctx *ctx, int dirfd, const char *dir,
                                   const char *list, const char *mask)
{
    static const int kinds[2] = {0, 1};
    const char *names[2] = {list, mask};
    return get_set(ctx, dirfd, dir, names, kinds, 2, 3);
}

/* ---- id lists from directory names ----------------------------------------------------- */

struct id_list {
    struct scan_ctx *ctx;
    const char *prefix;
    size_t plen;
    const char *suffix;
    int64_t *ids;
    uint32_t n, cap;
    int64_t limit;
};

static void collect_id(void *arg, const char *name, unsigned char type)
{
    struct id_list *l = arg;
    const char *p = name + l->plen;
    size_t slen = l->suffix ? strlen(l->suffix) : 0, n;
    int64_t v = 0;

    (void)type;
    if (strncmp(name, l->prefix, l->plen) != 0)
        return;
    n = strlen(p);
    if (n <= slen || (slen && strcmp(p + n - slen, l->suffix) != 0))
        return;
    n -= slen;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || v >= l->limit)
            return;
        v = v * 10 + (p[i] - '0');
    }
    if (v >= l->limit)
        return;
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? l->cap * 2 : 64;
        int64_t *ni = realloc(l->ids, nc * sizeof *ni);
        if (ni == NULL) {
            l->ctx->oom = 1;
            return;
        }
        l->ids = ni;
        l->cap = nc;
    }
    l->ids[l->n++] = v;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Ids N of entries named prefix<N>suffix, ascending and unique; 0 or the listing's errno. */
static int list_ids(struct scan_ctx *ctx, int fd, const char *prefix, const char *suffix,
                    int64_t limit, struct id_list *l)
{
    int err;
    uint32_t j = 0;

    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->prefix = prefix;
    l->plen = strlen(prefix);
    l->suffix = suffix;
    l->limit = limit;
    err = list_dir(ctx, fd, collect_id, l);
    if (l->n)
        qsort(l->ids, l->n, sizeof *l->ids, cmp_i64);
    for (uint32_t i = 0; i < l->n; i++)
        if (i == 0 || l->ids[i] != l->ids[i - 1])
            l->ids[j++] = l->ids[i];
    l->n = j;
    return err;
}

/* ---- CPUs ------------------------------------------------------------------------------ */

enum {
    T_PACKAGE_ID, T_DIE_ID, T_CLUSTER_ID, T_CORE_ID, T_BOOK_ID, T_DRAWER_ID,
    T_THREAD_LIST, T_THREAD_MASK, T_CORE_CPUS_LIST, T_CORE_CPUS,
    T_PACKAGE_LIST, T_PACKAGE_MASK, T_CORE_SIB_LIST, T_CORE_SIB,
    T_DIE_LIST, T_DIE_MASK, T_CLUSTER_LIST, T_CLUSTER_MASK,
    T_BOOK_LIST, T_BOOK_MASK, T_DRAWER_LIST, T_DRAWER_MASK, T_COUNT
};

static const char *const topo_names[T_COUNT] = {
    "physical_package_id", "die_id", "cluster_id", "core_id", "book_id", "drawer_id",
    "thread_siblings_list", "thread_siblings", "core_cpus_list", "core_cpus",
    "package_cpus_list", "package_cpus", "core_siblings_list", "core_siblings",
    "die_cpus_list", "die_cpus", "cluster_cpus_list", "cluster_cpus",
    "book_siblings_list", "book_siblings", "drawer_siblings_list", "drawer_siblings",
};

static const int topo_is_mask[T_COUNT] = {
    0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
};

static void mark_name(uint32_t *present, const char *const *names, int count, const char *name)
{
    for (int i = 0; i < count; i++)
        if (name[0] == names[i][0] && strcmp(name, names[i]) == 0) {
            *present |= 1u << i;
            return;
        }
}

static void mark_topo(void *arg, const char *name, unsigned char type)
{
    (void)type;
    mark_name(arg, topo_names, T_COUNT, name);
}

enum { C_ONLINE, C_TOPOLOGY, C_CACHE, C_CPUFREQ, C_CAPACITY, C_COUNT };
static const char *const cpu_names[C_COUNT] = {"online", "topology", "cache", "cpufreq",
                                               "cpu_capacity"};

static void mark_cpu(void *arg, const char *name, unsigned char type)
{
    (void)type;
    mark_name(arg, cpu_names, C_COUNT, name);
}

/* The sharing map comes before the list: the kernel derives the list from the map, and where a
 * dump's two disagree (64fake-4n2s2ca2c2t) the map is the one hwloc and the kernel trust. */
static const char *const cache_set_names[2] = {"shared_cpu_map", "shared_cpu_list"};
static const int cache_is_mask[2] = {1, 0};

static int64_t parse_size(const char *s, size_t n, int *err)
{
    int64_t v, mul = 1;

    trim(&s, &n);
    if (n > 0) {
        switch (s[n - 1]) {
        case 'K': case 'k': mul = 1ll << 10; n--; break;
        case 'M': case 'm': mul = 1ll << 20; n--; break;
        case 'G': case 'g': mul = 1ll << 30; n--; break;
        default: break;
        }
    }
    *err = parse_int(s, n, 0, &v);
    if (*err)
        return -1;
    if (v < 0 || v > INT64_MAX / mul) {
        *err = ERANGE;
        return -1;
    }
    return v * mul;
}

static int32_t set_min(const struct scan_ctx *ctx, topo_set_t s)
{
    if (s.off < 0)
        return -1;
    for (uint32_t w = 0; w < s.n; w++) {
        uint64_t v = ctx->pub.words[s.off + (int32_t)w];
        if (v)
            return (int32_t)(w * 64 + (uint32_t)__builtin_ctzll(v));
    }
    return -1;
}

static int same_set(topo_set_t a, topo_set_t b)
{
    return a.off >= 0 && a.off == b.off && a.n == b.n;
}

/* The record of CPU `id` among the first `upto` (ascending ids), NULL when not scanned. */
static const topo_cpu_t *find_cpu(const struct scan_ctx *ctx, uint32_t upto, int32_t id)
{
    uint32_t lo = 0, hi = upto;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ctx->pub.cpus[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < upto && ctx->pub.cpus[lo].id == id ? &ctx->pub.cpus[lo] : NULL;
}

static const topo_cpu_t *part_find(const struct scan_ctx *ctx, int64_t id);

/* A CPU scanned earlier that states the same set: a sibling, whose shared facts are ours.  The
 * lowest member is asked; when the CPUs are scanned in parts, the lowest this part has scanned
 * (one in another part cannot be asked: then the set is read in full). */
static const topo_cpu_t *donor_for(const struct scan_ctx *ctx, uint32_t slot, int32_t id,
                                   topo_set_t shared)
{
    int32_t first = set_min(ctx, shared);

    if (first < 0 || first >= id)
        return NULL;
    if (!ctx->part)
        return find_cpu(ctx, slot, first);
    for (uint32_t w = (uint32_t)first / 64; w < shared.n && (int64_t)w * 64 < id; w++) {
        uint64_t v = ctx->pub.words[shared.off + (int32_t)w];
        while (v) {
            int64_t m = (int64_t)w * 64 + __builtin_ctzll(v);
            const topo_cpu_t *d;
            if (m >= id)
                return NULL;
            if ((d = part_find(ctx, m)) != NULL)
                return d;
            v &= v - 1;
        }
    }
    return NULL;
}

static void scan_cache(struct scan_ctx *ctx, uint32_t slot, int cachefd, const char *cachedir,
                       int64_t index)
{
    char name[32], prefix[40], dir[512], path[64];
    const topo_cpu_t *cpu = &ctx->pub.cpus[slot], *donor;
    topo_cache_t *c;
    topo_set_t shared;
    uint32_t nerrors = ctx->pub.nerrors;
    size_t len;
    int64_t v;
    int err;

    snprintf(name, sizeof name, "index%lld", (long long)index);
    snprintf(prefix, sizeof prefix, "%s/", name);
    snprintf(dir, sizeof dir, "%s/%s", cachedir, name);

    /* Every CPU sharing a cache shows the same indexM folder: when the lowest sharer was
     * scanned already and states the same set, its record is this one (hwloc reads only the
     * first sharer's files, for the same reason). */
    shared = get_set_pref(ctx, cachefd, cachedir, prefix, cache_set_names, cache_is_mask,
                          2, &ctx->pref_shared);
    donor = donor_for(ctx, slot, cpu->id, shared);
    if (donor) {
        for (uint32_t i = donor->cache_off; i < donor->cache_off + donor->ncaches; i++) {
            if (ctx->pub.caches[i].index != index || !same_set(ctx->pub.caches[i].cpus, shared) ||
                ctx->pub.caches[i].flags & TOPO_F_PARTIAL)
                continue;
            if (GROW(ctx, caches, ncaches, cap_caches, 1))
                return;
            ctx->pub.caches[ctx->pub.ncaches++] = ctx->pub.caches[i];
            return;
        }
    }

    if (shared.off == TOPO_ABSENT && ctx->pub.nerrors == nerrors) {
        /* no sharing file at all: is the folder itself missing or unreadable? */
        int fd = open_dir_at(cachefd, name);
        if (fd < 0) {
            scan_add_error(ctx, errno, dir, NULL);
            return;
        }
        close(fd);
    }
    if (GROW(ctx, caches, ncaches, cap_caches, 1))
        return;
    c = &ctx->pub.caches[ctx->pub.ncaches++];
    memset(c, 0, sizeof *c);
    c->index = (int32_t)index;
    c->level = c->line_bytes = -1;
    c->id = c->size_bytes = -1;
    c->cpus = shared;
    /* Files are read through the cache folder's descriptor as "indexM/<file>": no open of the
     * index folder, no listing (a missing optional `id` costs one failed open). */
#define INDEX_FILE(f) (snprintf(path, sizeof path, "%s%s", prefix, f), path)
    c->level = get_id(ctx, cachefd, cachedir, INDEX_FILE("level"));
    c->line_bytes = get_id(ctx, cachefd, cachedir, INDEX_FILE("coherency_line_size"));
    if (get_int(ctx, cachefd, cachedir, INDEX_FILE("id"), 0, &v) == 0)
        c->id = v;
    err = scan_read(ctx, cachefd, INDEX_FILE("size"), &len, 0);
    if (err == 0)
        c->size_bytes = parse_size(ctx->buf, len, &err);
    if (err && err != ENOENT)
        scan_add_error(ctx, err, dir, "size");
    err = scan_read(ctx, cachefd, INDEX_FILE("type"), &len, 0);
    if (err == 0) {
        const char *t = ctx->buf;
        trim(&t, &len);
        if (len >= sizeof c->type)
            len = sizeof c->type - 1;
        memcpy(c->type, t, len);
    } else if (err != ENOENT) {
        scan_add_error(ctx, err, dir, "type");
    }
#undef INDEX_FILE
    if (ctx->pub.nerrors != nerrors)
        c->flags |= TOPO_F_PARTIAL;
}

/* An id file read without recording a problem: -1 when absent (as a full read gives), INT64_MIN
 * when unusable, which matches no record (the caller then reads in full and records it). */
static int64_t quiet_id(struct scan_ctx *ctx, int dirfd, const char *name)
{
    size_t len;
    int64_t v;
    int err = scan_read(ctx, dirfd, name, &len, 0);

    if (err == ENOENT)
        return -1;
    if (err || parse_int(ctx->buf, len, 0, &v) || v < INT32_MIN || v > INT32_MAX)
        return INT64_MIN;
    return v;
}

/* Scan cpuN/topology; returns the sibling whose facts were copied, or NULL when read in full. */
static const topo_cpu_t *scan_topology(struct scan_ctx *ctx, uint32_t slot, int cpufd,
                                       const char *cpudir)
{
    topo_cpu_t *c = &ctx->pub.cpus[slot];
    const topo_cpu_t *donor;
    uint32_t tp = 0, nerrors = ctx->pub.nerrors;
    char sub[128];
    int tfd, err;

    /* Threads of one core share their core's and package's facts: when the lowest thread was
     * scanned already and states the same siblings, copy them rather than read them again.
     * Stating the same siblings does not make two CPUs one core: AMD compute units (Bulldozer
     * family) list both of their cores as thread siblings, each with its own core_id.  So each
     * thread's core_id and package id are read, and the facts are copied only when both match
     * the donor's; die, cluster, book and drawer contain the core, so one core has one of each. */
    c->thread_siblings = get_set_pref(ctx, cpufd, cpudir, "topology/", topo_names + T_THREAD_LIST,
                                      topo_is_mask + T_THREAD_LIST, 4, &ctx->pref_thread);
    donor = donor_for(ctx, slot, c->id, c->thread_siblings);
    if (donor && donor->has_topology && !(donor->flags & TOPO_F_PARTIAL) &&
        same_set(donor->thread_siblings, c->thread_siblings) &&
        quiet_id(ctx, cpufd, "topology/core_id") == donor->core_id &&
        quiet_id(ctx, cpufd, "topology/physical_package_id") == donor->package_id) {
        c->has_topology = 1;
        c->package_id = donor->package_id;
        c->die_id = donor->die_id;
        c->cluster_id = donor->cluster_id;
        c->core_id = donor->core_id;
        c->book_id = donor->book_id;
        c->drawer_id = donor->drawer_id;
        c->package_cpus = donor->package_cpus;
        c->die_cpus = donor->die_cpus;
        c->cluster_cpus = donor->cluster_cpus;
        c->book_siblings = donor->book_siblings;
        c->drawer_siblings = donor->drawer_siblings;
        return donor;
    }

    snprintf(sub, sizeof sub, "%s/topology", cpudir);
    tfd = open_dir_at(cpufd, "topology");
    if (tfd < 0) {
        if (errno != ENOENT && ctx->pub.nerrors == nerrors)
            scan_add_error(ctx, errno, sub, NULL);
        return NULL;
    }
    c->has_topology = 1;
    err = list_dir(ctx, tfd, mark_topo, &tp);
    if (err) {
        scan_add_error(ctx, err, sub, NULL);
        tp = ~0u;
    }
    if (tp >> T_PACKAGE_ID & 1)
        c->package_id = get_id(ctx, tfd, sub, topo_names[T_PACKAGE_ID]);
    if (tp >> T_DIE_ID & 1)
        c->die_id = get_id(ctx, tfd, sub, topo_names[T_DIE_ID]);
    if (tp >> T_CLUSTER_ID & 1)
        c->cluster_id = get_id(ctx, tfd, sub, topo_names[T_CLUSTER_ID]);
    if (tp >> T_CORE_ID & 1)
        c->core_id = get_id(ctx, tfd, sub, topo_names[T_CORE_ID]);
    if (tp >> T_BOOK_ID & 1)
        c->book_id = get_id(ctx, tfd, sub, topo_names[T_BOOK_ID]);
    if (tp >> T_DRAWER_ID & 1)
        c->drawer_id = get_id(ctx, tfd, sub, topo_names[T_DRAWER_ID]);
    c->package_cpus = get_set(ctx, tfd, sub, topo_names + T_PACKAGE_LIST,
                              topo_is_mask + T_PACKAGE_LIST, 4, tp >> T_PACKAGE_LIST);
    c->die_cpus = get_set(ctx, tfd, sub, topo_names + T_DIE_LIST, topo_is_mask + T_DIE_LIST, 2,
                          tp >> T_DIE_LIST);
    c->cluster_cpus = get_set(ctx, tfd, sub, topo_names + T_CLUSTER_LIST,
                              topo_is_mask + T_CLUSTER_LIST, 2, tp >> T_CLUSTER_LIST);
    c->book_siblings = get_set(ctx, tfd, sub, topo_names + T_BOOK_LIST, topo_is_mask + T_BOOK_LIST,
                               2, tp >> T_BOOK_LIST);
    c->drawer_siblings = get_set(ctx, tfd, sub, topo_names + T_DRAWER_LIST,
                                 topo_is_mask + T_DRAWER_LIST, 2, tp >> T_DRAWER_LIST);
    if (ctx->pub.nerrors != nerrors)
        c->flags |= TOPO_F_PARTIAL;
    close(tfd);
    return NULL;
}

/* A thread whose core's first thread was scanned already shares that thread's caches when every
 * one of them includes it (the usual case: L1 and up are per core or wider): copy the records
 * rather than read the same files again.  A cache private to one thread means reading in full. */
static int copy_sibling_caches(struct scan_ctx *ctx, uint32_t slot, const topo_cpu_t *donor)
{
    uint32_t id = (uint32_t)ctx->pub.cpus[slot].id, first = donor->cache_off, n = donor->ncaches;

    if (n == 0)
        return 0;
    for (uint32_t i = first; i < first + n; i++)
        if (ctx->pub.caches[i].flags & TOPO_F_PARTIAL || !set_has(ctx, ctx->pub.caches[i].cpus, id))
            return 0;
    if (GROW(ctx, caches, ncaches, cap_caches, n))
        return 0;
    memcpy(&ctx->pub.caches[ctx->pub.ncaches], &ctx->pub.caches[first], n * sizeof *ctx->pub.caches);
    ctx->pub.ncaches += n;
    return 1;
}

static int scan_cpu(struct scan_ctx *ctx, int cpudirfd, uint32_t slot, int64_t id)
{
    char name[32], dir[96], sub[128];
    topo_cpu_t *c = &ctx->pub.cpus[slot];
    const topo_cpu_t *sibling = NULL;
    uint32_t present = 0;
    int fd, tfd, err;
    int64_t v;

    memset(c, 0, sizeof *c);
    c->id = (int32_t)id;
    c->package_id = c->die_id = c->cluster_id = c->core_id = c->book_id = c->drawer_id = -1;
    c->capacity = c->max_freq_khz = -1;
    c->thread_siblings.off = c->package_cpus.off = c->die_cpus.off = TOPO_ABSENT;
    c->cluster_cpus.off = c->book_siblings.off = c->drawer_siblings.off = TOPO_ABSENT;
    c->cache_off = ctx->pub.ncaches;
    c->online = 1;
    if (ctx->pub.online.off >= 0)
        c->online = set_has(ctx, ctx->pub.online, (uint32_t)id);

    snprintf(name, sizeof name, "cpu%lld", (long long)id);
    snprintf(dir, sizeof dir, "sys/devices/system/cpu/%s", name);
    fd = open_dir_at(cpudirfd, name);
    if (fd < 0) {
        scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    err = list_dir(ctx, fd, mark_cpu, &present);
    if (err) {
        scan_add_error(ctx, err, dir, NULL);
        present = ~0u;
    }

    if (present >> C_ONLINE & 1 && get_int(ctx, fd, dir, "online", 0, &v) == 0)
        c->online = v != 0;
    if (present >> C_CAPACITY & 1)
        get_int(ctx, fd, dir, "cpu_capacity", 0, &c->capacity);
    if (present >> C_CPUFREQ & 1) {
        /* cpuN/cpufreq is a link to ../cpufreq/policyM on live systems: resolve it in the root */
        int ffd;
        snprintf(sub, sizeof sub, "%s/cpufreq/cpuinfo_max_freq", dir);
        ffd = open_in_root(ctx, sub, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        if (ffd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
        } else {
            size_t len;
            err = read_fd(ctx, ffd, &len, 0);
            close(ffd);
            if (err == 0)
                err = parse_int(ctx->buf, len, 0, &c->max_freq_khz);
            if (err) {
                c->max_freq_khz = -1;
                scan_add_error(ctx, err, sub, NULL);
            }
        }
    }

    if (present >> C_TOPOLOGY & 1)
        sibling = scan_topology(ctx, slot, fd, dir);

    if (present >> C_CACHE & 1 && !(sibling && copy_sibling_caches(ctx, slot, sibling))) {
        snprintf(sub, sizeof sub, "%s/cache", dir);
        tfd = open_dir_at(fd, "cache");
        if (tfd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
        } else {
            struct id_list l;
            err = list_ids(ctx, tfd, "index", NULL, MAX_CACHES_PER_CPU, &l);
            if (err)
                scan_add_error(ctx, err, sub, NULL);
            for (uint32_t i = 0; i < l.n; i++)
                scan_cache(ctx, slot, tfd, sub, l.ids[i]);
            free(l.ids);
            close(tfd);
        }
    }
    c->ncaches = ctx->pub.ncaches - c->cache_off;
    close(fd);
    return 0;
}

/* ---- CPUs in parallel ------------------------------------------------------------------ */

/* The scan is bound by syscalls (about 70 per CPU folder), and they run in parallel: on a machine
 * with many CPUs, threads share the cpuN folders, each scanning into a context of its own, and
 * the records are merged in id order afterwards.  Work goes out in units the threads take as
 * they come free, so a thread the scheduler keeps waiting (a busy machine) costs one unit, not
 * a share.  A unit is a slice of each half of the ids: where a core's threads are numbered
 * ncpus/2 apart (x86: cpuK and cpuK+N/2) both land in one unit, and so do neighbours (POWER). */
#define PARTS_MIN_CPUS 32           /* fewer folders do not pay for a thread */
#define PARTS_CPUS_EACH 16
#define PARTS_AUTO_MAX 4
#define PARTS_MAX 16

struct part_entry {                 /* written by the thread that scans the id, read after join */
    int32_t slot;                   /* the record in that part's cpus, -1 when the folder failed */
    uint32_t part;
    uint32_t err_begin, err_end;    /* its errors in that part's errors */
};

struct scan_work {
    const int64_t *ids;             /* every id, ascending */
    uint32_t n, half, chunk, nunits;
    uint32_t next;                  /* the next unit to take (atomic) */
    int dirfd;                      /* sys/devices/system/cpu, shared read-only */
    struct part_entry *ent;         /* one per id */
};

struct cpu_part {
    struct scan_ctx ctx;            /* first: part_find gets from a context to its part */
    struct scan_work *work;
    uint32_t index;
    uint8_t *took;                  /* per unit: this part scanned it */
    uint32_t *wmap;                 /* part word offset -> merged offset + 1 (0: not yet) */
    pthread_t thread;
    int running;
};

_Static_assert(offsetof(struct cpu_part, ctx) == 0, "a part's context is its first member");

static int host_cpus(void)
{
    cpu_set_t set;
    long n;

    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > PARTS_MAX ? PARTS_MAX : n) : 1;
}

/* Let new threads run anywhere this one may, except where this one runs now.  Left to itself
 * the kernel often starts a new thread on its creator's CPU and moves it only at the next load
 * balance (milliseconds later, on an otherwise idle machine): the two would share one CPU for
 * about the whole scan.  A CPU set that does not fit cpu_set_t leaves the choice to the kernel. */
static void start_elsewhere(pthread_attr_t *attr)
{
    cpu_set_t set;
    int me = sched_getcpu();

    if (me < 0 || me >= CPU_SETSIZE || sched_getaffinity(0, sizeof set, &set) != 0)
        return;
    CPU_CLR(me, &set);
    if (CPU_COUNT(&set) > 0)
        pthread_attr_setaffinity_np(attr, sizeof set, &set);
}

static uint32_t pick_parts(int want, uint32_t ncpus)
{
    uint32_t n;

    if (want == 1 || ncpus < 2)
        return 1;
    if (want > 1)
        n = (uint32_t)(want > PARTS_MAX ? PARTS_MAX : want);
    else if (ncpus < PARTS_MIN_CPUS)
        return 1;
    else {
        int host = host_cpus();
        n = ncpus / PARTS_CPUS_EACH;
        if (n > PARTS_AUTO_MAX)
            n = PARTS_AUTO_MAX;
        if (host > 0 && n > (uint32_t)host)
            n = (uint32_t)host;
    }
    return n > ncpus ? ncpus : n < 1 ? 1 : n;
}

/* Index range [*b, *e) of ids that half h of unit u covers. */
static void unit_range(const struct scan_work *w, uint32_t u, int h, uint32_t *b, uint32_t *e)
{
    uint32_t lo = h ? w->half : 0, hi = h ? w->n : w->half;
    uint64_t x = (uint64_t)lo + (uint64_t)u * w->chunk, y = x + w->chunk;
    *b = (uint32_t)(x < hi ? x : hi);
    *e = (uint32_t)(y < hi ? y : hi);
}

static uint32_t unit_of(const struct scan_work *w, uint32_t idx)
{
    return idx < w->half ? idx / w->chunk : (idx - w->half) / w->chunk;
}

/* The record of CPU `id` when this part scanned it already. */
static const topo_cpu_t *part_find(const struct scan_ctx *ctx, int64_t id)
{
    const struct cpu_part *p = (const struct cpu_part *)ctx;
    const struct scan_work *w = p->work;
    uint32_t lo = 0, hi = w->n;
    const struct part_entry *e;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == w->n || w->ids[lo] != id || !p->took[unit_of(w, lo)])
        return NULL;
    e = &w->ent[lo];
    return e->slot >= 0 ? &ctx->pub.cpus[e->slot] : NULL;
}

static void *scan_part(void *arg)
{
    struct cpu_part *p = arg;
    struct scan_ctx *ctx = &p->ctx;
    struct scan_work *w = p->work;

    for (;;) {
        uint32_t u = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED), b0, e0, b1, e1;
        if (u >= w->nunits)
            break;
        unit_range(w, u, 0, &b0, &e0);
        unit_range(w, u, 1, &b1, &e1);
        if (GROW(ctx, cpus, ncpus, cap_cpus, (e0 - b0) + (e1 - b1)))
            break; /* out of memory: the merge fails the scan */
        p->took[u] = 1;
        for (int h = 0; h < 2; h++) {
            for (uint32_t i = h ? b1 : b0; i < (h ? e1 : e0); i++) {
                struct part_entry *e = &w->ent[i];
                e->part = p->index;
                e->err_begin = ctx->pub.nerrors;
                e->slot = -1;
                if (scan_cpu(ctx, w->dirfd, ctx->pub.ncpus, w->ids[i]) == 0)
                    e->slot = (int32_t)ctx->pub.ncpus++;
                e->err_end = ctx->pub.nerrors;
            }
        }
    }
    return NULL;
}

static void part_free(struct cpu_part *p)
{
    struct scan_ctx *c = &p->ctx;
    free(c->buf);
    free(c->scratch);
    free(c->slots);
    free(c->pub.cpus);
    free(c->pub.caches);
    free(c->pub.errors);
    free(c->pub.words);
    free(c->pub.strings);
    free(p->took);
    free(p->wmap);
}

static int part_init(struct scan_ctx *main_ctx, struct cpu_part *p, struct scan_work *w, uint32_t k)
{
    struct scan_ctx *c = &p->ctx;
    topo_set_t online = main_ctx->pub.online;

    memset(p, 0, sizeof *p);
    p->work = w;
    p->index = k;
    c->part = 1;
    c->rootfd = main_ctx->rootfd;
    c->is_host = main_ctx->is_host;
    c->have_openat2 = main_ctx->have_openat2;
    c->pref_thread = main_ctx->pref_thread;
    c->pref_shared = main_ctx->pref_shared;
    c->dir_eof_hint = main_ctx->dir_eof_hint;
    c->pub.status_path = -1;
    c->bufcap = 65536;
    c->buf = malloc(c->bufcap);
    c->scratch = malloc(TOPO_MAX_WORDS * sizeof *c->scratch);
    p->took = calloc(w->nunits, 1);
    scan_add_string(c, "", 0);
    /* each CPU's online state comes from this set; the main context's pool may move meanwhile */
    c->pub.online = online;
    if (online.off >= 0 && online.n > 0)
        c->pub.online = add_set(c, main_ctx->pub.words + online.off, online.n);
    if (c->buf == NULL || c->scratch == NULL || p->took == NULL || c->oom) {
        part_free(p);
        return -1;
    }
    return 0;
}

static topo_set_t remap_set(struct scan_ctx *ctx, struct cpu_part *p, topo_set_t s)
{
    topo_set_t out;

    if (s.off < 0 || s.n == 0)
        return s;
    if (p->wmap[s.off] == 0) {
        out = add_set(ctx, p->ctx.pub.words + s.off, s.n);
        if (out.off < 0)
            return out; /* out of memory: the scan fails */
        p->wmap[s.off] = (uint32_t)out.off + 1;
    }
    out.off = (int32_t)(p->wmap[s.off] - 1);
    out.n = s.n;
    return out;
}

/* Append one id's errors and CPU record (with its caches) to the main context. */
static void merge_entry(struct scan_ctx *ctx, struct cpu_part *p, const struct part_entry *e)
{
    const struct scan_ctx *pc = &p->ctx;
    topo_cpu_t c;

    for (uint32_t i = e->err_begin; i < e->err_end; i++) {
        const topo_error_t *pe = &pc->pub.errors[i];
        if (GROW(ctx, errors, nerrors, cap_errors, 1))
            return;
        ctx->pub.errors[ctx->pub.nerrors].code = pe->code;
        ctx->pub.errors[ctx->pub.nerrors].path =
            scan_add_string(ctx, pc->pub.strings + pe->path, strlen(pc->pub.strings + pe->path));
        ctx->pub.nerrors++;
    }
    if (e->slot < 0)
        return;
    c = pc->pub.cpus[e->slot];
    c.thread_siblings = remap_set(ctx, p, c.thread_siblings);
    c.package_cpus = remap_set(ctx, p, c.package_cpus);
    c.die_cpus = remap_set(ctx, p, c.die_cpus);
    c.cluster_cpus = remap_set(ctx, p, c.cluster_cpus);
    c.book_siblings = remap_set(ctx, p, c.book_siblings);
    c.drawer_siblings = remap_set(ctx, p, c.drawer_siblings);
    if (GROW(ctx, caches, ncaches, cap_caches, c.ncaches))
        return;
    for (uint32_t i = 0; i < c.ncaches; i++) {
        topo_cache_t *k = &ctx->pub.caches[ctx->pub.ncaches + i];
        *k = pc->pub.caches[c.cache_off + i];
        k->cpus = remap_set(ctx, p, k->cpus);
    }
    c.cache_off = ctx->pub.ncaches;
    ctx->pub.ncaches += c.ncaches;
    ctx->pub.cpus[ctx->pub.ncpus++] = c;
}

/* Scan the CPU folders of l on nparts threads (this one included); 0, or -1 when the parts could
 * not be set up (the caller then scans alone).  A thread that cannot start is simply missing. */
static int scan_cpus_parallel(struct scan_ctx *ctx, int dirfd, const struct id_list *l, uint32_t nparts)
{
    struct scan_work w;
    struct cpu_part *parts;
    pthread_attr_t attr;
    sigset_t all, old;
    uint32_t k, chunk;
    int have_attr;

    memset(&w, 0, sizeof w);
    w.ids = l->ids;
    w.n = l->n;
    w.half = l->n / 2;
    w.dirfd = dirfd;
    /* about four units a thread; a unit's slice of each half is a power of two of ids, 4 to 16,
     * so that SMT threads numbered side by side (up to 4 a core) stay in one unit */
    for (chunk = 4; chunk < 16 && chunk * 2 * nparts * 4 <= w.half; chunk *= 2)
        ;
    w.chunk = chunk;
    w.nunits = (l->n - w.half + chunk - 1) / chunk;
    w.ent = malloc(l->n * sizeof *w.ent);
    parts = calloc(nparts, sizeof *parts);
    if (w.ent == NULL || parts == NULL) {
        free(w.ent);
        free(parts);
        return -1;
    }
    for (k = 0; k < nparts; k++) {
        if (part_init(ctx, &parts[k], &w, k)) {
            while (k-- > 0)
                part_free(&parts[k]);
            free(parts);
            free(w.ent);
            return -1;
        }
    }
    /* the threads take no signals: the caller's handlers expect to run on the caller's thread */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    have_attr = pthread_attr_init(&attr) == 0;
    if (have_attr)
        start_elsewhere(&attr);
    for (k = 1; k < nparts; k++)
        parts[k].running =
            pthread_create(&parts[k].thread, have_attr ? &attr : NULL, scan_part, &parts[k]) == 0;
    if (have_attr)
        pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    scan_part(&parts[0]);
    for (k = 1; k < nparts; k++)
        if (parts[k].running)
            pthread_join(parts[k].thread, NULL);

    for (k = 0; k < nparts; k++) {
        parts[k].wmap = calloc(parts[k].ctx.pub.nwords ? parts[k].ctx.pub.nwords : 1, sizeof *parts[k].wmap);
        if (parts[k].wmap == NULL || parts[k].ctx.oom)
            ctx->oom = 1;
    }
    /* every unit was taken (the calling thread takes whatever is left); merge in id order */
    for (uint32_t i = 0; i < l->n && !ctx->oom; i++)
        merge_entry(ctx, &parts[w.ent[i].part], &w.ent[i]);
    for (k = 0; k < nparts; k++)
        part_free(&parts[k]);
    free(parts);
    free(w.ent);
    return 0;
}

static void scan_cpus(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/devices/system/cpu";
    struct id_list l;
    int fd = open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY);
    int err;

    if (fd < 0) {
        ctx->pub.status = errno;
        ctx->pub.status_path = scan_add_string(ctx, dir, sizeof dir - 1);
        return;
    }
    ctx->dir_eof_hint = fills_dir_buffers(fd);
    ctx->pub.possible = get_list(ctx, fd, dir, "possible");
    ctx->pub.present = get_list(ctx, fd, dir, "present");
    ctx->pub.online = get_list(ctx, fd, dir, "online");
    ctx->pub.offline = get_list(ctx, fd, dir, "offline");

    err = list_ids(ctx, fd, "cpu", NULL, TOPO_MAX_CPUS, &l);
    if (err) {
        ctx->pub.status = err;
        ctx->pub.status_path = scan_add_string(ctx, dir, sizeof dir - 1);
    } else if (GROW(ctx, cpus, ncpus, cap_cpus, l.n) == 0) {
        uint32_t nparts = pick_parts(ctx->parts, l.n);
        /* a cpuN entry that cannot be opened (a stray link or file) is an error, not a CPU */
        if (nparts < 2 || scan_cpus_parallel(ctx, fd, &l, nparts) != 0)
            for (uint32_t i = 0; i < l.n; i++)
                if (scan_cpu(ctx, fd, ctx->pub.ncpus, l.ids[i]) == 0)
                    ctx->pub.ncpus++;
    }
    free(l.ids);
    close(fd);
}

static void scan_kinds(struct scan_ctx *ctx)
{
    static const char core[] = "sys/devices/cpu_core", atom[] = "sys/devices/cpu_atom";
    int fd = open_in_root(ctx, core, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ctx->pub.kind_core = get_list(ctx, fd, core, "cpus");
        close(fd);
    }
    fd = open_in_root(ctx, atom, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ctx->pub.kind_atom = get_list(ctx, fd, atom, "cpus");
        close(fd);
    }
}

/* ---- NUMA nodes ------------------------------------------------------------------------ */

static int64_t add_int(struct scan_ctx *ctx, int64_t v)
{
    if (GROW(ctx, ints, nints, cap_ints, 1))
        return -1;
    ctx->pub.ints[ctx->pub.nints++] = v;
    return 0;
}

/* "Node 0 MemTotal:  16342332 kB" lines: the value in bytes of `key`, -1 when absent. */
static int64_t meminfo_value(const char *text, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = text; (p = strstr(p, key)) != NULL; p += klen) {
        const char *q = p + klen;
        int64_t v = 0;
        if (p != text && p[-1] != ' ' && p[-1] != '\n')
            continue;
        if (*q != ':')
            continue;
        q++;
        while (*q == ' ' || *q == '\t')
            q++;
        if (*q < '0' || *q > '9')
            return -1;
        while (*q >= '0' && *q <= '9') {
            if (v > INT64_MAX / 10 - 10)
                return -1;
            v = v * 10 + (*q++ - '0');
        }
        while (*q == ' ' || *q == '\t')
            q++;
        if ((q[0] == 'k' || q[0] == 'K') && q[1] == 'B')
            v = v > INT64_MAX / 1024 ? -1 : v * 1024;
        return v;
    }
    return -1;
}

static int cmp_hp(const void *a, const void *b)
{
    int64_t x = ((const topo_hugepages_t *)a)->size_bytes, y = ((const topo_hugepages_t *)b)->size_bytes;
    return (x > y) - (x < y);
}

static void scan_hugepages(struct scan_ctx *ctx, int nodefd, const char *nodedir, topo_node_t *nd)
{
    char dir[160], name[64], sub[256];
    struct id_list l;
    int fd = open_dir_at(nodefd, "hugepages"), err;

    nd->hp_off = ctx->pub.nhugepages;
    snprintf(dir, sizeof dir, "%s/hugepages", nodedir);
    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return;
    }
    err = list_ids(ctx, fd, "hugepages-", "kB", INT64_MAX / 1024, &l);
    if (err)
        scan_add_error(ctx, err, dir, NULL);
    for (uint32_t i = 0; i < l.n && i < MAX_HUGEPAGE_SIZES; i++) {
        int sfd;
        topo_hugepages_t hp;
        snprintf(name, sizeof name, "hugepages-%lldkB", (long long)l.ids[i]);
        snprintf(sub, sizeof sub, "%s/%s", dir, name);
        sfd = open_dir_at(fd, name);
        if (sfd < 0) {
            scan_add_error(ctx, errno, sub, NULL);
            continue;
        }
        hp.size_bytes = l.ids[i] * 1024;
        get_int(ctx, sfd, sub, "nr_hugepages", 0, &hp.total);
        get_int(ctx, sfd, sub, "free_hugepages", 0, &hp.free);
        close(sfd);
        if (GROW(ctx, hugepages, nhugepages, cap_hugepages, 1))
            break;
        ctx->pub.hugepages[ctx->pub.nhugepages++] = hp;
    }
    free(l.ids);
    close(fd);
    nd->nhp = ctx->pub.nhugepages - nd->hp_off;
    if (nd->nhp > 1)
        qsort(ctx->pub.hugepages + nd->hp_off, nd->nhp, sizeof *ctx->pub.hugepages, cmp_hp);
}

static int scan_node(struct scan_ctx *ctx, int nodesfd, uint32_t slot, int64_t id)
{
    char name[32], dir[96], sub[160];
    topo_node_t *nd = &ctx->pub.nodes[slot];
    size_t len;
    int fd, err;

    memset(nd, 0, sizeof *nd);
    nd->id = (int32_t)id;
    nd->mem_total_bytes = nd->mem_free_bytes = -1;
    nd->cpus.off = TOPO_ABSENT;
    nd->hp_off = ctx->pub.nhugepages;
    nd->dist_off = nd->init_off = ctx->pub.nints;
    snprintf(name, sizeof name, "node%lld", (long long)id);
    snprintf(dir, sizeof dir, "sys/devices/system/node/%s", name);
    fd = open_dir_at(nodesfd, name);
    if (fd < 0) {
        scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    nd->cpus = get_list_or_mask(ctx, fd, dir, "cpulist", "cpumap");

    err = scan_read(ctx, fd, "meminfo", &len, 0);
    if (err == 0) {
        nd->mem_total_bytes = meminfo_value(ctx->buf, "MemTotal");
        nd->mem_free_bytes = meminfo_value(ctx->buf, "MemFree");
        if (nd->mem_total_bytes < 0)
            scan_add_error(ctx, len ? EINVAL : ENODATA, dir, "meminfo");
    } else if (err != ENOENT) {
        scan_add_error(ctx, err, dir, "meminfo");
    }

    err = scan_read(ctx, fd, "distance", &len, 0);
    if (err == 0) {
        const char *p = ctx->buf, *end = ctx->buf + len;
        nd->dist_off = ctx->pub.nints;
        while (p < end && !err) {
            const char *q;
            int64_t v;
            while (p < end && is_blank(*p))
                p++;
            if (p == end)
                break;
            for (q = p; q < end && !is_blank(*q); q++)
                ;
            err = parse_int(p, (size_t)(q - p), 0, &v);
            if (!err)
                add_int(ctx, v);
            p = q;
        }
        if (err) {
            ctx->pub.nints = nd->dist_off;
            scan_add_error(ctx, err, dir, "distance");
        }
        nd->ndist = ctx->pub.nints - nd->dist_off;
    } else if (err != ENOENT) {
        scan_add_error(ctx, err, dir, "distance");
    }

    scan_hugepages(ctx, fd, dir, nd);

    /* HMAT initiators: access0 is the best-performing class; kernels or firmware that only
     * describe access1 (CPU initiators) still say which CPUs are local */
    nd->init_off = ctx->pub.nints;
    for (int access = 0; access < 2; access++) {
        char rel[40];
        int ifd;
        snprintf(rel, sizeof rel, "access%d/initiators", access);
        snprintf(sub, sizeof sub, "%s/%s", dir, rel);
        ifd = open_rel(ctx, fd, rel, O_RDONLY | O_DIRECTORY);
        if (ifd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
            continue;
        }
        {
            struct id_list l;
            err = list_ids(ctx, ifd, "node", NULL, TOPO_MAX_CPUS, &l);
            if (err)
                scan_add_error(ctx, err, sub, NULL);
            for (uint32_t i = 0; i < l.n; i++)
                add_int(ctx, l.ids[i]);
            free(l.ids);
            close(ifd);
        }
        break;
    }
    nd->ninit = ctx->pub.nints - nd->init_off;
    close(fd);
    return 0;
}

static void scan_nodes(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/devices/system/node";
    struct id_list l;
    int fd = open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY), err;

    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return;
    }
    ctx->pub.has_node_dir = 1;
    err = list_ids(ctx, fd, "node", NULL, TOPO_MAX_CPUS, &l);
    if (err)
        scan_add_error(ctx, err, dir, NULL);
    if (GROW(ctx, nodes, nnodes, cap_nodes, l.n) == 0) {
        for (uint32_t i = 0; i < l.n; i++)
            if (scan_node(ctx, fd, ctx->pub.nnodes, l.ids[i]) == 0)
                ctx->pub.nnodes++;
    }
    free(l.ids);
    close(fd);
}

/* ---- PCI ------------------------------------------------------------------------------- */

struct name_list {
    struct scan_ctx *ctx;
    char **names;
    uint32_t n, cap;
};

static void collect_name(void *arg, const char *name, unsigned char type)
{
    struct name_list *l = arg;
    (void)type;
    if (l->n >= MAX_PCI)
        return;
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? l->cap * 2 : 64;
        char **nn = realloc(l->names, nc * sizeof *nn);
        if (nn == NULL) {
            l->ctx->oom = 1;
            return;
        }
        l->names = nn;
        l->cap = nc;
    }
    if ((l->names[l->n] = strdup(name)) == NULL) {
        l->ctx->oom = 1;
        return;
    }
    l->n++;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lexically join base/target and fold "." and ".." without climbing above the root. */
static int join_in_root(const char *base, const char *target, char *out, size_t cap)
{
    char tmp[2048];
    size_t n = 0;
    char *save = NULL, *tok;
    int k = target[0] == '/' ? snprintf(tmp, sizeof tmp, "%s", target)
                             : snprintf(tmp, sizeof tmp, "%s/%s", base, target);

    if (k < 0 || (size_t)k >= sizeof tmp || cap == 0)
        return ENAMETOOLONG;
    out[0] = '\0';
    for (tok = strtok_r(tmp, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
        size_t tl = strlen(tok);
        if (strcmp(tok, ".") == 0)
            continue;
        if (strcmp(tok, "..") == 0) {
            while (n > 0 && out[n - 1] != '/')
                n--;
            if (n > 0)
                n--;
            out[n] = '\0';
            continue;
        }
        if (n + (n ? 1 : 0) + tl + 1 > cap)
            return ENAMETOOLONG;
        if (n)
            out[n++] = '/';
        memcpy(out + n, tok, tl + 1);
        n += tl;
    }
    if (n == 0)
        return EINVAL;
    return 0;
}

static int open_pci_device(struct scan_ctx *ctx, int devsfd, const char *devsdir, const char *name)
{
    char target[1024], rel[1024];
    ssize_t n = readlinkat(devsfd, name, target, sizeof target - 1);
    int fd;

    if (n < 0) {
        if (errno != EINVAL)
            return -1;
        return open_dir_at(devsfd, name); /* a real folder, not a link */
    }
    target[n] = '\0';
    if (join_in_root(devsdir, target, rel, sizeof rel)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = open_in_root(ctx, rel, O_RDONLY | O_DIRECTORY);
    return fd;
}

/* Open folder `dir` below the root and list its entries, sorted, into `l`.  Returns the folder's
 * descriptor, or -1 when it is absent (no error) or cannot be opened (an error is recorded). */
static int open_sorted_listing(struct scan_ctx *ctx, const char *dir, struct name_list *l)
{
    int fd = open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY), err;

    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    err = list_dir(ctx, fd, collect_name, l);
    if (err)
        scan_add_error(ctx, err, dir, NULL);
    if (l->n)
        qsort(l->names, l->n, sizeof *l->names, cmp_str);
    return fd;
}

static void scan_pci(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/bus/pci/devices";
    struct name_list l = {ctx, NULL, 0, 0};
    int fd = open_sorted_listing(ctx, dir, &l);

    if (fd < 0)
        return;
    for (uint32_t i = 0; i < l.n; i++) {
        char sub[512];
        struct stat st;
        topo_pci_t *p;
        int64_t v;
        int dfd = open_pci_device(ctx, fd, dir, l.names[i]);

        snprintf(sub, sizeof sub, "%s/%s", dir, l.names[i]);
        if (dfd < 0) {
            scan_add_error(ctx, errno, sub, NULL);
            continue;
        }
        /* virtual functions carry a physfn link to their parent; report physical functions */
        if (fstatat(dfd, "physfn", &st, AT_SYMLINK_NOFOLLOW) == 0 ||
            GROW(ctx, pci, npci, cap_pci, 1)) {
            close(dfd);
            continue;
        }
        p = &ctx->pub.pci[ctx->pub.npci++];
        memset(p, 0, sizeof *p);
        p->addr = scan_add_string(ctx, l.names[i], strlen(l.names[i]));
        get_int(ctx, dfd, sub, "class", 1, &p->class_code);
        get_int(ctx, dfd, sub, "vendor", 1, &p->vendor);
        get_int(ctx, dfd, sub, "device", 1, &p->device);
        get_int(ctx, dfd, sub, "numa_node", 0, &v);
        p->numa_node = v < -1 || v > INT32_MAX ? -1 : (int32_t)v;
        p->local_cpus = get_list_or_mask(ctx, dfd, sub, "local_cpulist", "local_cpus");
        close(dfd);
    }
    for (uint32_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    close(fd);
}

static void scan_meminfo(struct scan_ctx *ctx)
{
    size_t len;
    int err = scan_read_root(ctx, "proc/meminfo", &len, 1);

    if (err == 0) {
        ctx->pub.mem_total_bytes = meminfo_value(ctx->buf, "MemTotal");
        if (ctx->pub.mem_total_bytes < 0)
            scan_add_error(ctx, len ? EINVAL : ENODATA, "proc/meminfo", NULL);
    } else if (err != ENOENT) {
        scan_add_error(ctx, err, "proc/meminfo", NULL);
    }
}

/* NVIDIA's driver exposes coherent GPU memory (Grace Hopper, POWER9+V100) as NUMA nodes and
 * says which in /proc/driver/nvidia/gpus/<pci>/numa_status ("Node: N"). */
static void scan_gpu_nodes(struct scan_ctx *ctx)
{
    static const char dir[] = "proc/driver/nvidia/gpus";
    struct name_list l = {ctx, NULL, 0, 0};
    int fd = open_sorted_listing(ctx, dir, &l), err;

    if (fd < 0)
        return;
    for (uint32_t i = 0; i < l.n; i++) {
        char rel[320];
        const char *p;
        size_t len;
        int64_t node = -1;

        snprintf(rel, sizeof rel, "%s/numa_status", l.names[i]);
        err = scan_read(ctx, fd, rel, &len, 1);
        if (err == ENOENT)
            continue;
        if (err == 0) {
            p = strstr(ctx->buf, "Node:");
            err = EINVAL;
            if (p && (p == ctx->buf || p[-1] == '\n')) {
                const char *q = p + 5, *e;
                while (*q == ' ' || *q == '\t')
                    q++;
                for (e = q; *e && *e != '\n'; e++)
                    ;
                err = parse_int(q, (size_t)(e - q), 0, &node);
            }
        }
        if (err) {
            scan_add_error(ctx, err, dir, rel);
            continue;
        }
        if (node < 0 || node > INT32_MAX || GROW(ctx, gpu_nodes, ngpu_nodes, cap_gpu_nodes, 1))
            continue;
        ctx->pub.gpu_nodes[ctx->pub.ngpu_nodes].node = (int32_t)node;
        ctx->pub.gpu_nodes[ctx->pub.ngpu_nodes].addr = scan_add_string(ctx, l.names[i], strlen(l.names[i]));
        ctx->pub.ngpu_nodes++;
    }
    for (uint32_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    close(fd);
}

/* ---- entry points ---------------------------------------------------------------------- */

topo_scan_t *topo_scan(const char *root)
{
    return topo_scan_parts(root, 0);
}

/* TOPOLET_SCAN_NO_OPENAT2 set and not "0": dumps are opened through the fallback walk, as on a
 * kernel without openat2.  Read when a scan starts, before any thread of it. */
static int no_openat2(void)
{
    const char *v = getenv("TOPOLET_SCAN_NO_OPENAT2");
    return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

topo_scan_t *topo_scan_parts(const char *root, int32_t parts)
{
    static const topo_set_t absent = {TOPO_ABSENT, 0};
    struct scan_ctx *ctx = calloc(1, sizeof *ctx);
    struct stat rs, hs;

    if (ctx == NULL)
        return NULL;
    ctx->rootfd = -1;
    ctx->parts = parts < 0 ? 0 : parts;
    ctx->pub.status_path = -1;
    ctx->pub.possible = ctx->pub.present = ctx->pub.online = ctx->pub.offline = absent;
    ctx->pub.kind_core = ctx->pub.kind_atom = absent;
    ctx->pub.cpu_family = ctx->pub.cpu_model = -1;
    ctx->pub.mem_total_bytes = -1;
    scan_add_string(ctx, "", 0);
    ctx->bufcap = 65536;
    ctx->buf = malloc(ctx->bufcap);
    ctx->scratch = malloc(TOPO_MAX_WORDS * sizeof *ctx->scratch);
    if (ctx->buf == NULL || ctx->scratch == NULL || ctx->oom) {
        ctx->pub.status = ENOMEM;
        goto done;
    }
    if (root == NULL || *root == '\0')
        root = "/";
    ctx->rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ctx->rootfd < 0) {
        ctx->pub.status = errno;
        ctx->pub.status_path = scan_add_string(ctx, root, strlen(root));
        goto done;
    }
    ctx->is_host = fstat(ctx->rootfd, &rs) == 0 && stat("/", &hs) == 0 && rs.st_dev == hs.st_dev &&
                   rs.st_ino == hs.st_ino;
    /* the host's "/" needs no confinement; a dump's links must stay inside the dump, through
     * openat2 or, where it is missing (or TOPOLET_SCAN_NO_OPENAT2 is set, to test that path),
     * through a walk that resolves each link itself */
    ctx->have_openat2 = !ctx->is_host && !no_openat2();

    scan_cpus(ctx);
    if (ctx->pub.status)
        goto done;
    scan_kinds(ctx);
    scan_nodes(ctx);
    scan_cpuinfo(ctx);
    scan_meminfo(ctx);
    scan_pci(ctx);
    scan_gpu_nodes(ctx);
done:
    if (ctx->oom)
        ctx->pub.status = ENOMEM;
    if (ctx->rootfd >= 0)
        close(ctx->rootfd);
    free(ctx->buf);
    free(ctx->scratch);
    free(ctx->slots);
    ctx->buf = NULL;
    ctx->scratch = NULL;
    ctx->slots = NULL;
    return &ctx->pub;
}

void topo_scan_free(topo_scan_t *scan)
{
    if (scan == NULL)
        return;
    free(scan->cpus);
    free(scan->caches);
    free(scan->nodes);
    free(scan->hugepages);
    free(scan->ints);
    free(scan->pci);
    free(scan->gpu_nodes);
    free(scan->errors);
    free(scan->words);
    free(scan->strings);
    free((struct scan_ctx *)scan);
}
