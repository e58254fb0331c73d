/* cpulist and cpumask text <-> uint64 word bitmaps: the one parser topolet has. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "topolet.h"

/* A bitmap under construction in a caller's buffer: words are zeroed lazily up to the highest
 * word touched, so a big buffer costs nothing for a small set. */
struct bitmap_out {
    uint64_t *words;
    size_t cap;
    size_t zeroed;
    size_t need;        /* words needed for the highest bit set so far */
};

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Trim leading whitespace and trailing whitespace/NUL bytes; NUL bytes elsewhere stay (garbage). */
static void trim(const char **text, size_t *len)
{
    const char *s = *text;
    size_t n = *len;
    while (n > 0 && (s[n - 1] == '\0' || is_space(s[n - 1])))
        n--;
    while (n > 0 && is_space(s[0])) {
        s++;
        n--;
    }
    *text = s;
    *len = n;
}

static void touch(struct bitmap_out *b, size_t word)
{
    if (word + 1 > b->need)
        b->need = word + 1;
    if (word < b->cap && word >= b->zeroed) {
        memset(b->words + b->zeroed, 0, (word + 1 - b->zeroed) * sizeof(uint64_t));
        b->zeroed = word + 1;
    }
}

/* Set bits lo..hi inclusive (hi < TOPO_MAX_CPUS); bits past the buffer only raise `need`. */
static void set_range(struct bitmap_out *b, uint32_t lo, uint32_t hi)
{
    size_t wlo = lo / 64, whi = hi / 64;
    touch(b, whi);
    if (wlo >= b->cap)
        return;
    for (size_t w = wlo; w <= whi && w < b->cap; w++) {
        uint64_t m = ~(uint64_t)0;
        if (w == wlo)
            m &= ~(uint64_t)0 << (lo % 64);
        if (w == whi)
            m &= ~(uint64_t)0 >> (63 - hi % 64);
        b->words[w] |= m;
    }
}

static size_t trimmed_words(const struct bitmap_out *b)
{
    size_t n = b->need < b->zeroed ? b->need : b->zeroed;
    while (n > 0 && b->words[n - 1] == 0)
        n--;
    return n;
}

/* Read a decimal number at *p; saturates at TOPO_MAX_CPUS so huge ids report ERANGE, not wrap. */
static int read_dec(const char **p, const char *end, uint32_t *out)
{
    const char *s = *p;
    uint32_t v = 0;
    if (s >= end || *s < '0' || *s > '9')
        return EINVAL;
    while (s < end && *s >= '0' && *s <= '9') {
        if (v < TOPO_MAX_CPUS)
            v = v * 10 + (uint32_t)(*s - '0');
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

static void skip_blank(const char **p, const char *end)
{
    while (*p < end && (**p == ' ' || **p == '\t'))
        (*p)++;
}

/* One comma-separated item: "a", "a-b", "a-b:used/group" (kernel pattern) or "a-b:step". */
static int parse_item(const char **p, const char *end, struct bitmap_out *b)
{
    uint32_t lo, hi, used = 1, group = 1;
    int pattern = 0;

    skip_blank(p, end);
    if (read_dec(p, end, &lo))
        return EINVAL;
    hi = lo;
    if (*p < end && **p == '-') {
        (*p)++;
        if (read_dec(p, end, &hi))
            return EINVAL;
    }
    if (*p < end && **p == ':') {
        (*p)++;
        pattern = 1;
        if (read_dec(p, end, &used))
            return EINVAL;
        if (*p < end && **p == '/') {
            (*p)++;
            if (read_dec(p, end, &group))
                return EINVAL;
        } else {
            /* "a-b:step": every step-th CPU, i.e. the pattern 1/step. */
            group = used;
            used = 1;
        }
    }
    skip_blank(p, end);
    if (*p < end && **p != ',')
        return EINVAL;
    if (lo > hi)
        return EINVAL;
    if (hi >= TOPO_MAX_CPUS)
        return ERANGE;
    if (pattern && (used == 0 || group == 0 || used > group || group >= TOPO_MAX_CPUS))
        return EINVAL;
    if (!pattern || used == group) {
        set_range(b, lo, hi);
        return 0;
    }
    for (uint32_t start = lo; start <= hi; start += group) {
        uint32_t last = start + used - 1;
        set_range(b, start, last < hi ? last : hi);
        if (hi - start < group)
            break;
    }
    return 0;
}

int topo_parse_cpulist(const char *text, size_t len, uint64_t *out, size_t cap, size_t *nwords)
{
    struct bitmap_out b = {out, cap, 0, 0};
    const char *p, *end;

    *nwords = 0;
    if (text == NULL)
        return EINVAL;
    trim(&text, &len);
    p = text;
    end = text + len;
    while (p < end) {
        int rc = parse_item(&p, end, &b);
        if (rc)
            return rc;
        if (p < end) {
            p++; /* the comma */
            if (p == end)
                return EINVAL; /* trailing comma */
        }
    }
    if (b.need > cap) {
        *nwords = b.need;
        return ENOSPC;
    }
    *nwords = trimmed_words(&b);
    return 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int topo_parse_cpumask(const char *text, size_t len, uint64_t *out, size_t cap, size_t *nwords)
{
    struct bitmap_out b = {out, cap, 0, 0};
    size_t nchunks = 1, chunk;
    const char *p, *end;

    *nwords = 0;
    if (text == NULL)
        return EINVAL;
    trim(&text, &len);
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        nchunks += text[i] == ',';
    p = text;
    end = text + len;
    /* chunk counts down from the highest 32-bit word to word 0 */
    for (chunk = nchunks; chunk-- > 0;) {
        uint32_t v = 0;
        int digits = 0, d;
        while (p < end && *p != ',') {
            d = hex_digit(*p);
            if (d < 0 || ++digits > 8)
                return EINVAL;
            v = v << 4 | (uint32_t)d;
            p++;
        }
        if (digits == 0)
            return EINVAL;
        if (p < end)
            p++;
        if (v == 0)
            continue;
        if (chunk >= TOPO_MAX_CPUS / 32)
            return ERANGE;
        touch(&b, chunk / 2);
        if (chunk / 2 < cap)
            out[chunk / 2] |= (uint64_t)v << (32 * (chunk % 2));
    }
    if (b.need > cap) {
        *nwords = b.need;
        return ENOSPC;
    }
    *nwords = trimmed_words(&b);
    return 0;
}

static int bit_at(const uint64_t *w, size_t i)
{
    return (int)(w[i / 64] >> (i % 64) & 1);
}

int topo_format_cpulist(const uint64_t *words, size_t nwords, char *out, size_t cap, size_t *len)
{
    size_t n = 0, nbits = nwords * 64, i = 0;

    *len = 0;
    if (cap == 0)
        return ENOSPC;
    while (i < nbits) {
        size_t lo, hi;
        int k;
        if (words[i / 64] == 0 && i % 64 == 0) {
            i += 64;
            continue;
        }
        if (!bit_at(words, i)) {
            i++;
            continue;
        }
        lo = i;
        while (i < nbits && bit_at(words, i))
            i++;
        hi = i - 1;
        if (lo == hi)
            k = snprintf(out + n, cap - n, "%s%zu", n ? "," : "", lo);
        else
            k = snprintf(out + n, cap - n, "%s%zu-%zu", n ? "," : "", lo, hi);
        if (k < 0 || (size_t)k >= cap - n) {
            out[n] = '\0';
            return ENOSPC;
        }
        n += (size_t)k;
    }
    out[n] = '\0';
    *len = n;
    return 0;
}

int topo_format_cpumask(const uint64_t *words, size_t nwords, char *out, size_t cap, size_t *len)
{
    size_t n = 0, w32 = nwords * 2;

    *len = 0;
    while (w32 > 0 && (uint32_t)(words[(w32 - 1) / 2] >> (32 * ((w32 - 1) % 2))) == 0)
        w32--;
    if (w32 == 0) {
        if (cap < 2)
            return ENOSPC;
        out[0] = '0';
        out[1] = '\0';
        *len = 1;
        return 0;
    }
    for (size_t i = w32; i-- > 0;) {
        uint32_t v = (uint32_t)(words[i / 2] >> (32 * (i % 2)));
        int k = snprintf(out + n, cap - n, i == w32 - 1 ? "%x" : ",%08x", v);
        if (k < 0 || (size_t)k >= cap - n) {
            if (cap > 0)
                out[n < cap ? n : cap - 1] = '\0';
            return ENOSPC;
        }
        n += (size_t)k;
    }
    *len = n;
    return 0;
}
