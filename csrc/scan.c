/* One pass over a file-system root: sysfs CPU, cache, NUMA node and PCI facts into flat arrays.
 *
 * Every open is relative to a descriptor of the root, attribute files are opened O_NOFOLLOW, and
 * the only links followed on purpose (PCI device entries, cpuN/cpufreq, folders on the way to a
 * top-level folder) are resolved inside the root, by openat2 or by scan_fs.c's own walk where
 * the kernel lacks it: a dump cannot make the scan read the host, and a link loop costs one
 * failed open.  A file that cannot be used becomes an error record; the scan goes on.
 *
 * This file holds the entry points.  Each part of the walk has its own file: scan_cpus.c (CPUs
 * and caches), scan_numa.c (NUMA nodes and memory), scan_pci.c (PCI), cpuinfo.c (/proc/cpuinfo),
 * on the helpers of scan_fs.c (files) and scan_pool.c (memory), shared through scan_ctx.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

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
