/* Internal to the scan: the context that owns a topo_scan_t's memory, and the helpers shared by
 * its files: scan.c (entry points), scan_cpus.c, scan_numa.c, scan_pci.c, cpuinfo.c and cpuid.c
 * (what each reads), scan_fs.c (confined file access, parsing) and scan_pool.c (memory). */
#ifndef TOPOLET_SCAN_CTX_H
#define TOPOLET_SCAN_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "topolet.h"

#define SCAN_READ_CAP (8u << 20)    /* no file we read is legitimately bigger */

struct set_slot {
    uint64_t hash;
    int32_t off;
    uint32_t n;
};

struct scan_ctx {
    topo_scan_t pub;                /* first member: a topo_scan_t* is a struct scan_ctx* */
    uint32_t cap_cpus, cap_caches, cap_nodes, cap_hugepages, cap_ints, cap_pci, cap_gpu_nodes, cap_errors,
        cap_words, cap_strings;
    int oom;
    int rootfd;
    int is_host;                    /* root is the running system's "/" */
    int have_openat2;
    int pref_thread, pref_shared;   /* which sibling-set file name worked last */
    int dir_eof_hint;               /* getdents64 replies short only at the end */
    int parts;                      /* CPU folders scanned in this many parts, 0: chosen per scan */
    int part;                       /* this context is one part's (the first member of a cpu_part) */
    char *buf;                      /* file contents, NUL-terminated */
    size_t bufcap;
    uint64_t *scratch;              /* TOPO_MAX_WORDS words to parse sets into */
    struct set_slot *slots;         /* open-addressing table: identical sets share pool words */
    uint32_t nslots, used_slots;
};

/* ---- memory (scan_pool.c) ---- */

/* Append helpers: they set ctx->oom and return -1 (or an absent set) when memory runs out. */
int scan_grow(struct scan_ctx *ctx, void **arr, uint32_t *cap, uint64_t need, size_t elsz);
#define GROW(ctx, field, count, capf, extra)                                                      \
    scan_grow((ctx), (void **)&(ctx)->pub.field, &(ctx)->capf, (uint64_t)(ctx)->pub.count + (extra), \
              sizeof *(ctx)->pub.field)
int32_t scan_add_string(struct scan_ctx *ctx, const char *s, size_t len);
void scan_add_error(struct scan_ctx *ctx, int code, const char *dir, const char *name);
/* Put a set in the word pool, reusing the words of an identical set already there. */
topo_set_t scan_add_set(struct scan_ctx *ctx, const uint64_t *w, uint32_t n);
int scan_set_has(const struct scan_ctx *ctx, topo_set_t s, uint32_t cpu);

/* ---- files (scan_fs.c) ---- */

/* Open a path relative to the root, links on the way resolved inside it (the host's root: as is). */
int scan_open_in_root(struct scan_ctx *ctx, const char *rel, int flags);
/* Open a path below dirfd following no link at all (ELOOP), never climbing out of it. */
int scan_open_rel(struct scan_ctx *ctx, int dirfd, const char *path, int flags);
/* Open one folder below dirfd, not through a link. */
int scan_open_dir(int dirfd, const char *name);
int scan_read_fd(struct scan_ctx *ctx, int fd, size_t *len, int whole_stream);

/* Read a whole file under dirfd into ctx->buf; whole_stream loops to EOF (procfs), otherwise a
 * short read of a small file is taken as the end (sysfs attributes come in one read). */
#define SCAN_FIRST_BLOCK 2          /* whole_stream value: stop after the first blank line */
int scan_read(struct scan_ctx *ctx, int dirfd, const char *name, size_t *len, int whole_stream);
/* The same for a path relative to the root, resolved inside it. */
int scan_read_root(struct scan_ctx *ctx, const char *rel, size_t *len, int whole_stream);


/* List a directory through getdents64, calling fn per entry ("." and ".." left out); fd stays
 * usable for openat afterwards.  0 or an errno. */
typedef void (*entry_fn)(void *arg, const char *name, unsigned char type);
int scan_list_dir(const struct scan_ctx *ctx, int fd, entry_fn fn, void *arg);
/* Whether getdents64 on this file system replies short only at the end of a folder. */
int scan_fills_dir_buffers(int fd);

struct id_list {
    struct scan_ctx *ctx;
    const char *prefix;
    size_t plen;
    const char *suffix;
    int64_t *ids;
    uint32_t n, cap;
    int64_t limit;
};

/* Ids N of entries named prefix<N>suffix below `limit`, ascending and unique (free l->ids);
 * 0 or the listing's errno. */
int scan_list_ids(struct scan_ctx *ctx, int fd, const char *prefix, const char *suffix, int64_t limit,
                  struct id_list *l);

struct name_list {
    struct scan_ctx *ctx;
    char **names;
    uint32_t n, cap;
};

/* Open folder `dir` below the root and list its entries, sorted, into `l` (free each name and
 * l->names).  The folder's descriptor, or -1 when absent (no error) or unusable (recorded). */
int scan_open_sorted_listing(struct scan_ctx *ctx, const char *dir, struct name_list *l);

/* ---- values (scan_fs.c) ---- */

int scan_is_blank(char c);
void scan_trim(const char **s, size_t *n);
/* Whole text (after trimming) is one integer: decimal with optional sign, or 0x-prefixed hex. */
int scan_parse_int(const char *s, size_t n, int base16, int64_t *out);
/* A number file: 0 and *out set, ENOENT when absent (silent); any other problem is recorded. */
int scan_get_int(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name, int base16,
                 int64_t *out);
/* The same for an int32 id; -1 when absent, unusable or out of range. */
int32_t scan_get_id(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name);
/* A set from the first of `names` that exists (is_mask[i]: a cpumask, else a cpulist); `present`
 * is a bit per name from a directory listing, or ~0 to try each.  Absent when none is usable. */
topo_set_t scan_get_set(struct scan_ctx *ctx, int dirfd, const char *dir, const char *const *names,
                        const int *is_mask, int count, uint32_t present);
/* Like scan_get_set for names under `prefix`, trying first the name that worked last (*pref). */
topo_set_t scan_get_set_pref(struct scan_ctx *ctx, int dirfd, const char *dir, const char *prefix,
                             const char *const *names, const int *is_mask, int count, int *pref);
topo_set_t scan_get_list(struct scan_ctx *ctx, int dirfd, const char *dir, const char *name);
topo_set_t scan_get_list_or_mask(struct scan_ctx *ctx, int dirfd, const char *dir, const char *list,
                                 const char *mask);

/* ---- what the scan reads, in the order topo_scan_parts calls them ---- */

void scan_cpus(struct scan_ctx *ctx);        /* scan_cpus.c: status set when there is no CPU folder */
void scan_kinds(struct scan_ctx *ctx);       /* scan_cpus.c: hybrid core kinds */
void scan_nodes(struct scan_ctx *ctx);       /* scan_numa.c */
void scan_cpuinfo(struct scan_ctx *ctx);     /* cpuinfo.c */
void scan_meminfo(struct scan_ctx *ctx);     /* scan_numa.c: proc/meminfo */
void scan_pci(struct scan_ctx *ctx);         /* scan_pci.c */
void scan_gpu_nodes(struct scan_ctx *ctx);   /* scan_numa.c */

/* x86 cpuid on the running machine: vendor, family, model, brand, flags (Linux names, appended
 * space-separated to flags).  Returns 0 when not on x86. */
int cpuid_probe(char vendor[13], int *family, int *model, char brand[49], int *hypervisor,
                char *flags, size_t flags_cap);

#endif
