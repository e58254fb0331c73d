/* The scan's memory: growing record arrays, the string pool, error records, and the word pool in
 * which identical CPU sets share one offset. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_ctx.h"

int scan_grow(struct scan_ctx *ctx, void **arr, uint32_t *cap, uint64_t need, size_t elsz)
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
topo_set_t scan_add_set(struct scan_ctx *ctx, const uint64_t *w, uint32_t n)
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

int scan_set_has(const struct scan_ctx *ctx, topo_set_t s, uint32_t cpu)
{
    if (s.off < 0 || cpu / 64 >= s.n)
        return 0;
    return (int)(ctx->pub.words[s.off + (int32_t)(cpu / 64)] >> (cpu % 64) & 1);
}
