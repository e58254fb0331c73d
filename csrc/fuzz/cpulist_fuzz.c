/* libFuzzer harness for the cpulist and cpumask parsers.
 *
 * Every input goes through both parsers.  Whatever parses must survive a round trip through the
 * canonical formatter unchanged, a cpumask must mean the same set as its cpulist rendering, and a
 * too-small buffer must give ENOSPC with the needed size, never a partial answer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../topolet.h"

#define TEXT_CAP (8u << 20)

static uint64_t *words_a, *words_b;
static char *text;

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void round_trip(const uint64_t *w, size_t n)
{
    size_t len, m;

    check(n == 0 || w[n - 1] != 0); /* results are trimmed */
    check(topo_format_cpulist(w, n, text, TEXT_CAP, &len) == 0);
    check(strlen(text) == len);
    check(topo_parse_cpulist(text, len, words_b, TOPO_MAX_WORDS, &m) == 0);
    check(m == n && memcmp(w, words_b, n * sizeof *w) == 0);

    check(topo_format_cpumask(w, n, text, TEXT_CAP, &len) == 0);
    check(topo_parse_cpumask(text, len, words_b, TOPO_MAX_WORDS, &m) == 0);
    check(m == n && memcmp(w, words_b, n * sizeof *w) == 0);
}

static void small_buffer(int mask, const char *in, size_t size, const uint64_t *w, size_t n)
{
    uint64_t small[2];
    size_t m;
    int rc = mask ? topo_parse_cpumask(in, size, small, 2, &m)
                  : topo_parse_cpulist(in, size, small, 2, &m);
    if (n <= 2) {
        check(rc == 0 && m == n && memcmp(small, w, n * sizeof *w) == 0);
    } else {
        check(rc == ENOSPC && m == n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    size_t n;
    int rc;

    if (words_a == NULL) {
        words_a = malloc(TOPO_MAX_WORDS * sizeof *words_a);
        words_b = malloc(TOPO_MAX_WORDS * sizeof *words_b);
        text = malloc(TEXT_CAP);
        if (!words_a || !words_b || !text)
            abort();
    }

    rc = topo_parse_cpulist(in, size, words_a, TOPO_MAX_WORDS, &n);
    check(rc == 0 || rc == EINVAL || rc == ERANGE);
    if (rc == 0) {
        check(n <= TOPO_MAX_WORDS);
        small_buffer(0, in, size, words_a, n);
        round_trip(words_a, n);
    }

    rc = topo_parse_cpumask(in, size, words_a, TOPO_MAX_WORDS, &n);
    check(rc == 0 || rc == EINVAL || rc == ERANGE);
    if (rc == 0) {
        check(n <= TOPO_MAX_WORDS);
        small_buffer(1, in, size, words_a, n);
        round_trip(words_a, n);
    }
    return 0;
}
