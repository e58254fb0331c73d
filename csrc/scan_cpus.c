/* CPUs and their caches: sys/devices/system/cpu/cpuN (topology, cache/indexM, online, cpufreq,
 * capacity), scanned on several threads when there are many, and the hybrid core kinds. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

#define MAX_CACHES_PER_CPU 64

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

    scan_trim(&s, &n);
    if (n > 0) {
        switch (s[n - 1]) {
        case 'K': case 'k': mul = 1ll << 10; n--; break;
        case 'M': case 'm': mul = 1ll << 20; n--; break;
        case 'G': case 'g': mul = 1ll << 30; n--; break;
        default: break;
        }
    }
    *err = scan_parse_int(s, n, 0, &v);
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
    shared = scan_get_set_pref(ctx, cachefd, cachedir, prefix, cache_set_names, cache_is_mask,
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
        int fd = scan_open_dir(cachefd, name);
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
    c->level = scan_get_id(ctx, cachefd, cachedir, INDEX_FILE("level"));
    c->line_bytes = scan_get_id(ctx, cachefd, cachedir, INDEX_FILE("coherency_line_size"));
    if (scan_get_int(ctx, cachefd, cachedir, INDEX_FILE("id"), 0, &v) == 0)
        c->id = v;
    err = scan_read(ctx, cachefd, INDEX_FILE("size"), &len, 0);
    if (err == 0)
        c->size_bytes = parse_size(ctx->buf, len, &err);
    if (err && err != ENOENT)
        scan_add_error(ctx, err, dir, "size");
    err = scan_read(ctx, cachefd, INDEX_FILE("type"), &len, 0);
    if (err == 0) {
        const char *t = ctx->buf;
        scan_trim(&t, &len);
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
    if (err || scan_parse_int(ctx->buf, len, 0, &v) || v < INT32_MIN || v > INT32_MAX)
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
     * thread's core_id is read, and the facts are copied only when it matches the donor's.  The
     * other facts hold for every thread siblings set, compute units included: the kernel makes
     * CPUs siblings only within one package and die (and cluster, book, drawer, which contain
     * them), so the ids and sets of those are the donor's. */
    c->thread_siblings = scan_get_set_pref(ctx, cpufd, cpudir, "topology/", topo_names + T_THREAD_LIST,
                                           topo_is_mask + T_THREAD_LIST, 4, &ctx->pref_thread);
    donor = donor_for(ctx, slot, c->id, c->thread_siblings);
    if (donor && donor->has_topology && !(donor->flags & TOPO_F_PARTIAL) &&
        same_set(donor->thread_siblings, c->thread_siblings) &&
        quiet_id(ctx, cpufd, "topology/core_id") == donor->core_id) {
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
    tfd = scan_open_dir(cpufd, "topology");
    if (tfd < 0) {
        if (errno != ENOENT && ctx->pub.nerrors == nerrors)
            scan_add_error(ctx, errno, sub, NULL);
        return NULL;
    }
    c->has_topology = 1;
    err = scan_list_dir(ctx, tfd, mark_topo, &tp);
    if (err) {
        scan_add_error(ctx, err, sub, NULL);
        tp = ~0u;
    }
    if (tp >> T_PACKAGE_ID & 1)
        c->package_id = scan_get_id(ctx, tfd, sub, topo_names[T_PACKAGE_ID]);
    if (tp >> T_DIE_ID & 1)
        c->die_id = scan_get_id(ctx, tfd, sub, topo_names[T_DIE_ID]);
    if (tp >> T_CLUSTER_ID & 1)
        c->cluster_id = scan_get_id(ctx, tfd, sub, topo_names[T_CLUSTER_ID]);
    if (tp >> T_CORE_ID & 1)
        c->core_id = scan_get_id(ctx, tfd, sub, topo_names[T_CORE_ID]);
    if (tp >> T_BOOK_ID & 1)
        c->book_id = scan_get_id(ctx, tfd, sub, topo_names[T_BOOK_ID]);
    if (tp >> T_DRAWER_ID & 1)
        c->drawer_id = scan_get_id(ctx, tfd, sub, topo_names[T_DRAWER_ID]);
    c->package_cpus = scan_get_set(ctx, tfd, sub, topo_names + T_PACKAGE_LIST,
                                   topo_is_mask + T_PACKAGE_LIST, 4, tp >> T_PACKAGE_LIST);
    c->die_cpus = scan_get_set(ctx, tfd, sub, topo_names + T_DIE_LIST, topo_is_mask + T_DIE_LIST, 2,
                               tp >> T_DIE_LIST);
    c->cluster_cpus = scan_get_set(ctx, tfd, sub, topo_names + T_CLUSTER_LIST,
                                   topo_is_mask + T_CLUSTER_LIST, 2, tp >> T_CLUSTER_LIST);
    c->book_siblings = scan_get_set(ctx, tfd, sub, topo_names + T_BOOK_LIST, topo_is_mask + T_BOOK_LIST,
                                    2, tp >> T_BOOK_LIST);
    c->drawer_siblings = scan_get_set(ctx, tfd, sub, topo_names + T_DRAWER_LIST,
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
        if (ctx->pub.caches[i].flags & TOPO_F_PARTIAL || !scan_set_has(ctx, ctx->pub.caches[i].cpus, id))
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
        c->online = scan_set_has(ctx, ctx->pub.online, (uint32_t)id);

    snprintf(name, sizeof name, "cpu%lld", (long long)id);
    snprintf(dir, sizeof dir, "sys/devices/system/cpu/%s", name);
    fd = scan_open_dir(cpudirfd, name);
    if (fd < 0) {
        scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    err = scan_list_dir(ctx, fd, mark_cpu, &present);
    if (err) {
        scan_add_error(ctx, err, dir, NULL);
        present = ~0u;
    }

    if (present >> C_ONLINE & 1 && scan_get_int(ctx, fd, dir, "online", 0, &v) == 0)
        c->online = v != 0;
    if (present >> C_CAPACITY & 1)
        scan_get_int(ctx, fd, dir, "cpu_capacity", 0, &c->capacity);
    if (present >> C_CPUFREQ & 1) {
        /* cpuN/cpufreq is a link to ../cpufreq/policyM on live systems: resolve it in the root */
        int ffd;
        snprintf(sub, sizeof sub, "%s/cpufreq/cpuinfo_max_freq", dir);
        ffd = scan_open_in_root(ctx, sub, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        if (ffd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
        } else {
            size_t len;
            err = scan_read_fd(ctx, ffd, &len, 0);
            close(ffd);
            if (err == 0)
                err = scan_parse_int(ctx->buf, len, 0, &c->max_freq_khz);
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
        tfd = scan_open_dir(fd, "cache");
        if (tfd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
        } else {
            struct id_list l;
            err = scan_list_ids(ctx, tfd, "index", NULL, MAX_CACHES_PER_CPU, &l);
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
        c->pub.online = scan_add_set(c, main_ctx->pub.words + online.off, online.n);
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
        out = scan_add_set(ctx, p->ctx.pub.words + s.off, s.n);
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

void scan_cpus(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/devices/system/cpu";
    struct id_list l;
    int fd = scan_open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY);
    int err;

    if (fd < 0) {
        ctx->pub.status = errno;
        ctx->pub.status_path = scan_add_string(ctx, dir, sizeof dir - 1);
        return;
    }
    ctx->dir_eof_hint = scan_fills_dir_buffers(fd);
    ctx->pub.possible = scan_get_list(ctx, fd, dir, "possible");
    ctx->pub.present = scan_get_list(ctx, fd, dir, "present");
    ctx->pub.online = scan_get_list(ctx, fd, dir, "online");
    ctx->pub.offline = scan_get_list(ctx, fd, dir, "offline");

    err = scan_list_ids(ctx, fd, "cpu", NULL, TOPO_MAX_CPUS, &l);
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

void scan_kinds(struct scan_ctx *ctx)
{
    static const char core[] = "sys/devices/cpu_core", atom[] = "sys/devices/cpu_atom";
    int fd = scan_open_in_root(ctx, core, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ctx->pub.kind_core = scan_get_list(ctx, fd, core, "cpus");
        close(fd);
    }
    fd = scan_open_in_root(ctx, atom, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ctx->pub.kind_atom = scan_get_list(ctx, fd, atom, "cpus");
        close(fd);
    }
}
