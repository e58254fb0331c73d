/* Internal to the scan: the context that owns a topo_scan_t's memory, and the pieces shared by
 * scan.c (sysfs walk), cpuinfo.c (/proc parsing) and cpuid.c. */
#ifndef TOPOLET_SCAN_CTX_H
#define TOPOLET_SCAN_CTX_H

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

/* Append helpers: they set ctx->oom and return -1 (or an absent set) when memory runs out. */
int32_t scan_add_string(struct scan_ctx *ctx, const char *s, size_t len);
void scan_add_error(struct scan_ctx *ctx, int code, const char *dir, const char *name);

/* Read a whole file under dirfd into ctx->buf; whole_stream loops to EOF (procfs), otherwise a
 * short read of a small file is taken as the end (sysfs attributes come in one read). */
#define SCAN_FIRST_BLOCK 2          /* whole_stream value: stop after the first blank line */
int scan_read(struct scan_ctx *ctx, int dirfd, const char *name, size_t *len, int whole_stream);
/* The same for a path relative to the root, resolved inside it. */
int scan_read_root(struct scan_ctx *ctx, const char *rel, size_t *len, int whole_stream);

void scan_cpuinfo(struct scan_ctx *ctx);

/* x86 cpuid on the running machine: vendor, family, model, brand, flags (Linux names, appended
 * space-separated to flags).  Returns 0 when not on x86. */
int cpuid_probe(char vendor[13], int *family, int *model, char brand[49], int *hypervisor,
                char *flags, size_t flags_cap);

#endif
