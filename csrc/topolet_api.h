/* topolet C helper: public declarations.
 *
 * This file is read twice: by the C compiler (through topolet.h) and by cffi's cdef parser, so it
 * holds only plain declarations and integer #defines: no includes, no guards, no macros with bodies.
 *
 * Conventions: every function returns 0 or a positive errno value; nothing aborts or prints.
 * CPU sets are uint64 word bitmaps (bit i of word w is CPU 64*w+i).  A scan keeps every set in
 * one pool of words; a record refers to a set by (off, n): off is a word offset into the pool,
 * -1 when the file that would give the set was absent.  Identical sets share one offset.
 */

#define TOPO_MAX_CPUS 1048576       /* ids at or above this are rejected (ERANGE) */
#define TOPO_MAX_WORDS 16384        /* TOPO_MAX_CPUS / 64 */
#define TOPO_ABSENT -1
#define TOPO_F_PARTIAL 1            /* record flag: some file behind it could not be used */

typedef struct {
    int32_t off;                    /* word offset in the pool, TOPO_ABSENT when unknown */
    uint32_t n;                     /* number of words (0 for the empty set) */
} topo_set_t;

typedef struct {
    int32_t index;                  /* M of cache/indexM */
    int32_t level;
    int32_t line_bytes;
    uint32_t flags;                 /* TOPO_F_* */
    int64_t id;
    int64_t size_bytes;
    topo_set_t cpus;
    char type[16];
} topo_cache_t;

typedef struct {
    int32_t id;
    int32_t online;
    int32_t has_topology;
    int32_t package_id;
    int32_t die_id;
    int32_t cluster_id;
    int32_t core_id;
    int32_t book_id;
    int32_t drawer_id;
    uint32_t cache_off;             /* index of the first cache in scan->caches */
    uint32_t ncaches;
    uint32_t flags;                 /* TOPO_F_PARTIAL: a topology file could not be used */
    int64_t capacity;
    int64_t max_freq_khz;
    topo_set_t thread_siblings;
    topo_set_t package_cpus;
    topo_set_t die_cpus;
    topo_set_t cluster_cpus;
    topo_set_t book_siblings;
    topo_set_t drawer_siblings;
} topo_cpu_t;

typedef struct {
    int64_t size_bytes;
    int64_t total;
    int64_t free;
} topo_hugepages_t;

typedef struct {
    int32_t id;
    uint32_t hp_off;                /* index into scan->hugepages */
    uint32_t nhp;
    uint32_t dist_off;              /* index into scan->ints */
    uint32_t ndist;
    uint32_t init_off;              /* index into scan->ints: access0, else access1, initiators */
    uint32_t ninit;
    int64_t mem_total_bytes;
    int64_t mem_free_bytes;
    topo_set_t cpus;
} topo_node_t;

typedef struct {
    int32_t addr;                   /* string offset */
    int32_t numa_node;
    int64_t class_code;
    int64_t vendor;
    int64_t device;
    topo_set_t local_cpus;
} topo_pci_t;

typedef struct {
    int32_t node;                   /* NUMA node made of the GPU's memory */
    int32_t addr;                   /* string offset: the GPU's PCI address */
} topo_gpu_node_t;

typedef struct {
    int32_t code;                   /* errno value */
    int32_t path;                   /* string offset: the path relative to the root */
} topo_error_t;

typedef struct {
    int32_t status;                 /* 0, or the errno of a hard error (the scan stopped) */
    int32_t status_path;            /* string offset of the path that caused it, -1 when none */

    topo_set_t possible;
    topo_set_t present;
    topo_set_t online;
    topo_set_t offline;
    topo_set_t kind_core;           /* sys/devices/cpu_core/cpus */
    topo_set_t kind_atom;           /* sys/devices/cpu_atom/cpus */

    int32_t has_node_dir;
    int32_t hypervisor;
    int32_t cpu_family;
    int32_t cpu_model;
    int32_t cpu_vendor;             /* string offsets, "" when unknown */
    int32_t cpu_model_name;
    int32_t cpu_flags;              /* space separated, as the source wrote them */
    int32_t arch;
    int64_t mem_total_bytes;

    topo_cpu_t *cpus;
    uint32_t ncpus;
    topo_cache_t *caches;
    uint32_t ncaches;
    topo_node_t *nodes;
    uint32_t nnodes;
    topo_hugepages_t *hugepages;
    uint32_t nhugepages;
    int64_t *ints;
    uint32_t nints;
    topo_pci_t *pci;
    uint32_t npci;
    topo_gpu_node_t *gpu_nodes;     /* /proc/driver/nvidia/gpus/<pci>/numa_status, by address */
    uint32_t ngpu_nodes;
    topo_error_t *errors;
    uint32_t nerrors;
    uint64_t *words;
    uint32_t nwords;
    char *strings;                  /* NUL-terminated strings back to back */
    uint32_t nstrings;
} topo_scan_t;

/* Parse a kernel cpulist ("0-3,8,10-15", kernel "a-b:used/group" patterns, "a-b:step").
 * Leading/trailing whitespace and trailing NULs are ignored; "" is the empty set.  Writes up to
 * cap words to out and the used word count to *nwords.  ENOSPC when cap is too small (then
 * *nwords is the count needed), EINVAL for malformed text, ERANGE for ids >= TOPO_MAX_CPUS. */
int topo_parse_cpulist(const char *text, size_t len, uint64_t *out, size_t cap, size_t *nwords);

/* Parse a kernel cpumask ("ff,00000001": 32-bit hex words, highest first); same contract. */
int topo_parse_cpumask(const char *text, size_t len, uint64_t *out, size_t cap, size_t *nwords);

/* Write the canonical cpulist of a bitmap ("" for empty) with a NUL; ENOSPC when it does not fit. */
int topo_format_cpulist(const uint64_t *words, size_t nwords, char *out, size_t cap, size_t *len);

/* Write a kernel-style cpumask ("0" for empty; 8 hex digits per 32-bit word after the first). */
int topo_format_cpumask(const uint64_t *words, size_t nwords, char *out, size_t cap, size_t *len);

/* Scan the file-system root once.  NULL only when memory runs out; otherwise free the result
 * with topo_scan_free, and check status first. */
topo_scan_t *topo_scan(const char *root);
/* The same, choosing how the CPU folders are split between threads: 0 decides from their count
 * and the CPUs this process may use, 1 scans on the calling thread only, N > 1 uses N parts (at
 * most 16).  Every choice gives the same facts, unless threads of one core disagree in
 * their files (a sibling scanned by another part is read in full, not copied). */
topo_scan_t *topo_scan_parts(const char *root, int32_t parts);
void topo_scan_free(topo_scan_t *scan);

/* sched_setaffinity / sched_getaffinity on a word bitmap (pid 0 = the calling thread).
 * get: *nwords receives the used word count; ENOSPC with the needed count when cap is too small. */
int topo_set_affinity(int32_t pid, const uint64_t *words, size_t nwords);
int topo_get_affinity(int32_t pid, uint64_t *out, size_t cap, size_t *nwords);

#define TOPO_MPOL_DEFAULT 0
#define TOPO_MPOL_PREFERRED 1
#define TOPO_MPOL_BIND 2

/* set_mempolicy(2) for the calling thread through the raw syscall; words is a node bitmap
 * (ignored for TOPO_MPOL_DEFAULT). */
int topo_set_mempolicy(int32_t mode, const uint64_t *words, size_t nwords);

/* inotify(7), for watching cgroup folders and files.  The event bits are the kernel's (inotify.c
 * checks each against <sys/inotify.h> at compile time). */
#define TOPO_IN_MODIFY 0x00000002
#define TOPO_IN_CREATE 0x00000100
#define TOPO_IN_DELETE 0x00000200
#define TOPO_IN_DELETE_SELF 0x00000400
#define TOPO_IN_MOVE_SELF 0x00000800
#define TOPO_IN_Q_OVERFLOW 0x00004000
#define TOPO_IN_IGNORED 0x00008000
#define TOPO_IN_ONLYDIR 0x01000000
#define TOPO_IN_ISDIR 0x40000000
#define TOPO_INOTIFY_MIN_READ 272   /* sizeof(struct inotify_event) + NAME_MAX + 1: one event always fits */

typedef struct {
    int32_t wd;                     /* the watch; -1 with TOPO_IN_Q_OVERFLOW */
    uint32_t mask;                  /* TOPO_IN_* bits */
    int32_t name;                   /* offset in the names buffer, -1 when the event names nothing */
} topo_inotify_event_t;

/* inotify_init1(IN_NONBLOCK | IN_CLOEXEC): *fd is the new descriptor (close it with close(2)). */
int topo_inotify_init(int32_t *fd);
/* inotify_add_watch(2): *wd is the watch (the same one again for a path already watched). */
int topo_inotify_add_watch(int32_t fd, const char *path, uint32_t mask, int32_t *wd);
/* inotify_rm_watch(2); EINVAL when the watch is gone already (its file was removed). */
int topo_inotify_rm_watch(int32_t fd, int32_t wd);
/* One read(2) of the queued events, never blocking: 0 events when none are queued.  Each event
 * becomes a record in events and its name, NUL-terminated, goes to names (back to back).  The read
 * takes at most min(cap * 16, names_cap) bytes, so whatever it returns fits both; that must be at
 * least TOPO_INOTIFY_MIN_READ (EINVAL otherwise). */
int topo_inotify_read(int32_t fd, topo_inotify_event_t *events, size_t cap, char *names,
                      size_t names_cap, size_t *nevents);
