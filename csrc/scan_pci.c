/* PCI functions: sys/bus/pci/devices, each entry's link resolved inside the root; virtual
 * functions are left out. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

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
        return scan_open_dir(devsfd, name); /* a real folder, not a link */
    }
    target[n] = '\0';
    if (join_in_root(devsdir, target, rel, sizeof rel)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = scan_open_in_root(ctx, rel, O_RDONLY | O_DIRECTORY);
    return fd;
}

void scan_pci(struct scan_ctx *ctx)
{
    static const char dir[] = "sys/bus/pci/devices";
    struct name_list l = {ctx, NULL, 0, 0};
    int fd = scan_open_sorted_listing(ctx, dir, &l);

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
        scan_get_int(ctx, dfd, sub, "class", 1, &p->class_code);
        scan_get_int(ctx, dfd, sub, "vendor", 1, &p->vendor);
        scan_get_int(ctx, dfd, sub, "device", 1, &p->device);
        scan_get_int(ctx, dfd, sub, "numa_node", 0, &v);
        p->numa_node = v < -1 || v > INT32_MAX ? -1 : (int32_t)v;
        p->local_cpus = scan_get_list_or_mask(ctx, dfd, sub, "local_cpulist", "local_cpus");
        close(dfd);
    }
    for (uint32_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    close(fd);
}
