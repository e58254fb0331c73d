/* NUMA nodes and memory: sys/devices/system/node/nodeN (CPUs, meminfo, distances, hugepages, HMAT
 * initiators), proc/meminfo, and the NUMA nodes NVIDIA's driver makes of GPU memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

#define MAX_HUGEPAGE_SIZES 64

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
    int fd = scan_open_dir(nodefd, "hugepages"), err;

    nd->hp_off = ctx->pub.nhugepages;
    snprintf(dir, sizeof dir, "%s/hugepages", nodedir);
    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return;
    }
    err = scan_list_ids(ctx, fd, "hugepages-", "kB", INT64_MAX / 1024, &l);
    if (err)
        scan_add_error(ctx, err, dir, NULL);
    for (uint32_t i = 0; i < l.n && i < MAX_HUGEPAGE_SIZES; i++) {
        int sfd;
        topo_hugepages_t hp;
        snprintf(name, sizeof name, "hugepages-%lldkB", (long long)l.ids[i]);
        snprintf(sub, sizeof sub, "%s/%s", dir, name);
        sfd = scan_open_dir(fd, name);
        if (sfd < 0) {
            scan_add_error(ctx, errno, sub, NULL);
            continue;
        }
        hp.size_bytes = l.ids[i] * 1024;
        scan_get_int(ctx, sfd, sub, "nr_hugepages", 0, &hp.total);
        scan_get_int(ctx, sfd, sub, "free_hugepages", 0, &hp.free);
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
    fd = scan_open_dir(nodesfd, name);
    if (fd < 0) {
        scan_add_error(ctx, errno, dir, NULL);
        return -1;
    }
    nd->cpus = scan_get_list_or_mask(ctx, fd, dir, "cpulist", "cpumap");

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
            while (p < end && scan_is_blank(*p))
                p++;
            if (p == end)
                break;
            for (q = p; q < end && !scan_is_blank(*q); q++)
                ;
            err = scan_parse_int(p, (size_t)(q - p), 0, &v);
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
        ifd = scan_open_rel(ctx, fd, rel, O_RDONLY | O_DIRECTORY);
        if (ifd < 0) {
            if (errno != ENOENT)
                scan_add_error(ctx, errno, sub, NULL);
            continue;
        }
        {
            struct id_list l;
            err = scan_list_ids(ctx, ifd, "node", NULL, TOPO_MAX_CPUS, &l);
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

void scan_nodes(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/devices/system/node";
    struct id_list l;
    int fd = scan_open_in_root(ctx, dir, O_RDONLY | O_DIRECTORY), err;

    if (fd < 0) {
        if (errno != ENOENT)
            scan_add_error(ctx, errno, dir, NULL);
        return;
    }
    ctx->pub.has_node_dir = 1;
    err = scan_list_ids(ctx, fd, "node", NULL, TOPO_MAX_CPUS, &l);
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

void scan_meminfo(struct scan_ctx *ctx)
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
void scan_gpu_nodes(struct scan_ctx *ctx)
{
    static const char dir[] = "proc/driver/nvidia/gpus";
    struct name_list l = {ctx, NULL, 0, 0};
    int fd = scan_open_sorted_listing(ctx, dir, &l), err;

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
                err = scan_parse_int(q, (size_t)(e - q), 0, &node);
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
