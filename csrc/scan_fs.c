/* The scan's file access, confined to the root: opens (through openat2, or a walk of our own where
 * the kernel lacks it), bounded reads, directory listings, and values parsed from small files. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

#define DIR_BUF 16384
#define MAX_NAMES 65536             /* entries kept from one listing by name */
#define SMALL_FILE 4096

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

int scan_open_in_root(struct scan_ctx *ctx, const char *rel, int flags)
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

int scan_read_fd(struct scan_ctx *ctx, int fd, size_t *len, int whole_stream)
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
int scan_open_rel(struct scan_ctx *ctx, int dirfd, const char *path, int flags)
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
    int fd = scan_open_rel(ctx, dirfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    int err;

    *len = 0;
    if (fd < 0)
        return errno;
    err = scan_read_fd(ctx, fd, len, whole_stream);
    close(fd);
    return err;
}

int scan_read_root(struct scan_ctx *ctx, const char *rel, size_t *len, int whole_stream)
{
    int fd = scan_open_in_root(ctx, rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    int err;

    *len = 0;
    if (fd < 0)
        return errno;
    err = scan_read_fd(ctx, fd, len, whole_stream);
    close(fd);
    return err;
}

int scan_open_dir(int dirfd, const char *name)
{
    return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
}


struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* File systems whose getdents64 fills the buffer until the folder ends, so a reply with room
 * to spare is the last one (FUSE and network file systems may stop early: they get no shortcut). */
int scan_fills_dir_buffers(int fd)
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
int scan_list_dir(const struct scan_ctx *ctx, int fd, entry_fn fn, void *arg)
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

int scan_is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\0';
}

void scan_trim(const char **s, size_t *n)
{
    while (*n > 0 && scan_is_blank((*s)[*n - 1]))
        (*n)--;
    while (*n > 0 && scan_is_blank(**s)) {
        (*s)++;
        (*n)--;
    }
}

/* Whole text (after trimming) is one integer: decimal with optional sign, or 0x-prefixed hex. */
int scan_parse_int(const char *s, size_t n, int base16, int64_t *out)
{
    int neg = 0;
    uint64_t v = 0;
    size_t i = 0;

    scan_trim(&s, &n);
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
int scan_get_int(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name, int base16,
                 int64_t *out)
{
    size_t len;
    int err = scan_read(ctx, dirfd, name, &len, 0);

    *out = -1;
    if (err == 0)
        err = scan_parse_int(ctx->buf, len, base16, out);
    if (err && err != ENOENT) {
        *out = -1;
        scan_add_error(ctx, err, dir, name);
    }
    return err;
}

int32_t scan_get_id(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name)
{
    int64_t v;
    if (scan_get_int(ctx, dirfd, dir, name, 0, &v) || v < INT32_MIN || v > INT32_MAX)
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
    *out = scan_add_set(ctx, ctx->scratch, (uint32_t)n);
    return 0;
}

/* A set from the first of `names` that exists (lists and masks alternate as the caller orders
 * them).  `present` is a bit per name from a directory listing, or ~0 to just try each. */
topo_set_t scan_get_set(struct scan_ctx *ctx, int dirfd, const char *dir, const char *const *names,
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

/* Like scan_get_set for names under `prefix` ("topology/", "index2/"), trying first the name that
 * worked last time (*pref): sibling folders nearly always offer the same files. */
topo_set_t scan_get_set_pref(struct scan_ctx *ctx, int dirfd, const char *dir, const char *prefix,
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

topo_set_t scan_get_list(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name)
{
    static const int no_mask[1] = {0};
    return scan_get_set(ctx, dirfd, dir, &name, no_mask, 1, 1);
}

topo_set_t scan_get_list_or_mask(struct scan_ctx *ctx, int dirfd, const char *dir,
                                 const char *list, const char *mask)
{
    static const int kinds[2] = {0, 1};
    const char *names[2] = {list, mask};
    return scan_get_set(ctx, dirfd, dir, names, kinds, 2, 3);
}

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
int scan_list_ids(struct scan_ctx *ctx, int fd, const char *prefix, const char *suffix,
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
    err = scan_list_dir(ctx, fd, collect_id, l);
    if (l->n)
        qsort(l->ids, l->n, sizeof *l->ids, cmp_i64);
    for (uint32_t i = 0; i < l->n; i++)
        if (i == 0 || l->ids[i] != l->ids[i - 1])
            l->ids[j++] = l->ids[i];
    l->n = j;
    return err;
}

static void collect_name(void *arg, const char *name, unsigned char type)
{
    struct name_list *l = arg;
    (void)type;
    if (l->n >= MAX_NAMES)
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

/* Open folder `dir` below the root and list its entries, sorted, into `l`.  Returns the folder's
 * descriptor, or -1 when it is absent (no error) or cannot be opened (an error is recorded). */
int scan_open_sorted_listing(struct scan_ctx *ctx, const char *dir, struct name_list *l)
{
    int fd = scan_open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY), err;

    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    err = scan_list_dir(ctx, fd, collect_name, l);
    if (err)
        scan_add_error(ctx, err, dir, NULL);
    if (l->n)
        qsort(l->names, l->n, sizeof *l->names, cmp_str);
    return fd;
}
