/* CPU affinity and NUMA memory policy for pinning: thin wrappers returning errno values.
 * set_mempolicy goes through the raw syscall so topolet needs no libnuma. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "topolet.h"

/* The kernel's affinity calls take a byte count; on 64-bit Linux a cpumask is an array of
 * unsigned long, which is exactly our uint64 words. */
_Static_assert(sizeof(unsigned long) == sizeof(uint64_t) || sizeof(unsigned long) == 4,
               "unexpected unsigned long size");

int topo_set_affinity(int32_t pid, const uint64_t *words, size_t nwords)
{
    size_t bytes = nwords * sizeof(uint64_t);

    if (nwords == 0)
        return EINVAL; /* an empty set can never run */
    if (nwords > TOPO_MAX_WORDS)
        return ERANGE;
    if (sched_setaffinity((pid_t)pid, bytes, (const cpu_set_t *)(const void *)words) != 0)
        return errno;
    return 0;
}

int topo_get_affinity(int32_t pid, uint64_t *out, size_t cap, size_t *nwords)
{
    /* The kernel refuses buffers smaller than its own nr_cpu_ids bits (EINVAL): grow a private
     * buffer until it fits, then report what was set. */
    size_t words = 16;
    uint64_t *buf = NULL;
    int rc;

    *nwords = 0;
    for (;;) {
        uint64_t *nb = realloc(buf, words * sizeof *buf);
        long got;
        if (nb == NULL) {
            free(buf);
            return ENOMEM;
        }
        buf = nb;
        memset(buf, 0, words * sizeof *buf);
        got = syscall(SYS_sched_getaffinity, (pid_t)pid, words * sizeof *buf, buf);
        if (got >= 0)
            break;
        if (errno != EINVAL || words >= TOPO_MAX_WORDS) {
            rc = errno;
            free(buf);
            return rc;
        }
        words *= 2;
    }
    while (words > 0 && buf[words - 1] == 0)
        words--;
    if (words > cap) {
        *nwords = words;
        free(buf);
        return ENOSPC;
    }
    memcpy(out, buf, words * sizeof *buf);
    *nwords = words;
    free(buf);
    return 0;
}

int topo_set_mempolicy(int32_t mode, const uint64_t *words, size_t nwords)
{
    /* maxnode counts bits and the kernel reads one fewer than given (a historical off-by-one
     * every caller compensates for) */
    unsigned long maxnode = (unsigned long)nwords * 64 + 1;
    long rc;

    switch (mode) {
    case TOPO_MPOL_DEFAULT:
        rc = syscall(SYS_set_mempolicy, 0, NULL, 0UL);
        break;
    case TOPO_MPOL_PREFERRED:
    case TOPO_MPOL_BIND:
        if (nwords == 0)
            return EINVAL;
        if (nwords > TOPO_MAX_WORDS)
            return ERANGE;
        rc = syscall(SYS_set_mempolicy, mode, words, maxnode);
        break;
    default:
        return EINVAL;
    }
    return rc == 0 ? 0 : errno;
}
