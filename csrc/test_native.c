/* A small standalone test of the C helper: parser tables, formatter, and a scan that must not
 * fail on the build machine's own root or crash on a missing one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "topolet.h"

static int failures;

#define EXPECT(cond, ...)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            failures++;                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

struct row {
    int mask;
    const char *text;
    size_t len; /* 0: strlen */
    int rc;
    const char *cpulist; /* canonical rendering when rc == 0 */
};

static const struct row rows[] = {
    {0, "0-3,8,10-15", 0, 0, "0-3,8,10-15"},
    {0, "", 0, 0, ""},
    {0, "\n", 0, 0, ""},
    {0, "  5 \n", 0, 0, "5"},
    {0, "2,0,1", 0, 0, "0-2"},
    {0, "0-3\n\0\0\0", 7, 0, "0-3"},
    {0, "0-9:2/5", 0, 0, "0-1,5-6"},
    {0, "0-7:2", 0, 0, "0,2,4,6"},
    {0, "1048575", 0, 0, "1048575"},
    {0, "1048576", 0, ERANGE, NULL},
    {0, "99999999999999999999", 0, ERANGE, NULL},
    {0, "3-1", 0, EINVAL, NULL},
    {0, "1,,2", 0, EINVAL, NULL},
    {0, "1,", 0, EINVAL, NULL},
    {0, "a", 0, EINVAL, NULL},
    {0, "-1", 0, EINVAL, NULL},
    {0, "1 2", 0, EINVAL, NULL},
    {0, "0-3:0/4", 0, EINVAL, NULL},
    {0, "0-3:5/4", 0, EINVAL, NULL},
    {0, "1\0" "2", 3, EINVAL, NULL},
    {1, "ff,00000001", 0, 0, "0,32-39"},
    {1, "00000000,00000000,0000000f\n", 0, 0, "0-3"},
    {1, "", 0, 0, ""},
    {1, "0", 0, 0, ""},
    {1, "f0\0\0", 4, 0, "4-7"},
    {1, "80000000,00000000,00000000", 0, 0, "95"},
    {1, "g", 0, EINVAL, NULL},
    {1, "123456789", 0, EINVAL, NULL},
    {1, "ff,,1", 0, EINVAL, NULL},
    {1, "0x3", 0, EINVAL, NULL},
};

static void test_parsers(void)
{
    uint64_t words[TOPO_MAX_WORDS];
    char text[256];

    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const struct row *r = &rows[i];
        size_t len = r->len ? r->len : strlen(r->text), n, tl;
        int rc = r->mask ? topo_parse_cpumask(r->text, len, words, TOPO_MAX_WORDS, &n)
                         : topo_parse_cpulist(r->text, len, words, TOPO_MAX_WORDS, &n);
        EXPECT(rc == r->rc, "row %zu %s: rc %d, want %d", i, r->text, rc, r->rc);
        if (rc || r->rc)
            continue;
        rc = topo_format_cpulist(words, n, text, sizeof text, &tl);
        EXPECT(rc == 0 && strcmp(text, r->cpulist) == 0, "row %zu: got '%s' want '%s'", i, text,
               r->cpulist);
    }
}

static void test_small_buffer(void)
{
    uint64_t words[2];
    size_t n;
    EXPECT(topo_parse_cpulist("200", 3, words, 2, &n) == ENOSPC && n == 4, "need 4 words, got %zu", n);
    EXPECT(topo_parse_cpulist("127", 3, words, 2, &n) == 0 && n == 2 && words[1] == 1ull << 63,
           "fits in 2 words");
}

static void test_mask_format(void)
{
    uint64_t words[2] = {0x1ull | 0xffull << 32, 0};
    char text[64];
    size_t len;
    EXPECT(topo_format_cpumask(words, 2, text, sizeof text, &len) == 0 && !strcmp(text, "ff,00000001"),
           "mask '%s'", text);
    EXPECT(topo_format_cpumask(words, 0, text, sizeof text, &len) == 0 && !strcmp(text, "0"),
           "empty mask '%s'", text);
}

static void test_scan(void)
{
    topo_scan_t *s = topo_scan("/nonexistent/topolet-root");
    EXPECT(s && s->status == ENOENT && s->status_path >= 0, "missing root is a hard error");
    topo_scan_free(s);

    s = topo_scan("/");
    EXPECT(s && s->status == 0, "scan of / failed: %d", s ? s->status : -1);
    EXPECT(s && s->ncpus > 0, "no CPUs on /");
    topo_scan_free(s);
}

/* Scan a root on one thread and in several parts: the same counts (the Python tests compare the
 * records themselves); under the sanitizers this is the threaded scan's memory and race check. */
static void test_scan_root(const char *root)
{
    static const int32_t parts[] = {1, 2, 3, 4, 0};
    topo_scan_t *one = topo_scan_parts(root, 1);

    EXPECT(one && one->status == 0, "%s: scan failed: %d", root, one ? one->status : -1);
    for (size_t i = 1; one && one->status == 0 && i < sizeof parts / sizeof parts[0]; i++) {
        topo_scan_t *s = topo_scan_parts(root, parts[i]);
        EXPECT(s && s->status == 0 && s->ncpus == one->ncpus && s->ncaches == one->ncaches &&
                   s->nerrors == one->nerrors,
               "%s: %d parts: %u cpus %u caches %u errors, one thread %u %u %u", root, parts[i],
               s ? s->ncpus : 0, s ? s->ncaches : 0, s ? s->nerrors : 0, one->ncpus, one->ncaches,
               one->nerrors);
        for (uint32_t c = 0; s && c < s->ncpus && c < one->ncpus; c++)
            EXPECT(s->cpus[c].id == one->cpus[c].id && s->cpus[c].ncaches == one->cpus[c].ncaches,
                   "%s: %d parts: cpu slot %u differs", root, parts[i], c);
        topo_scan_free(s);
    }
    topo_scan_free(one);
}

/* A folder made in a watched folder is one IN_CREATE|IN_ISDIR event naming it; nothing queued
 * reads as no events; a read too small for one event is refused. */
static void test_inotify(void)
{
    char dir[] = "/tmp/topolet-inotify-XXXXXX", sub[64];
    topo_inotify_event_t ev[4];
    char names[TOPO_INOTIFY_MIN_READ];
    int32_t fd, wd;
    size_t n = 99;

    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    EXPECT(topo_inotify_init(&fd) == 0 && fd >= 0, "init");
    EXPECT(topo_inotify_add_watch(fd, dir, TOPO_IN_CREATE | TOPO_IN_ONLYDIR, &wd) == 0, "add_watch");
    EXPECT(topo_inotify_read(fd, ev, 4, names, sizeof names, &n) == EINVAL, "4 records are too few");
    EXPECT(topo_inotify_read(fd, ev, 1, names, sizeof names, &n) == EINVAL && n == 0, "too small");
    EXPECT(topo_inotify_read(fd, ev, 4, names, sizeof names - 1, &n) == EINVAL, "names too small");
    snprintf(sub, sizeof sub, "%s/pod1", dir);
    EXPECT(mkdir(sub, 0700) == 0, "mkdir");
    {
        topo_inotify_event_t many[TOPO_INOTIFY_MIN_READ / 16 + 1];
        EXPECT(topo_inotify_read(fd, many, sizeof many / sizeof many[0], names, sizeof names, &n) == 0 &&
                   n == 1 && many[0].wd == wd && many[0].mask == (TOPO_IN_CREATE | TOPO_IN_ISDIR) &&
                   many[0].name == 0 && strcmp(names, "pod1") == 0,
               "one IN_CREATE naming pod1 (%zu events)", n);
        EXPECT(topo_inotify_read(fd, many, sizeof many / sizeof many[0], names, sizeof names, &n) == 0 &&
                   n == 0, "nothing queued");
    }
    EXPECT(topo_inotify_rm_watch(fd, wd) == 0, "rm_watch");
    EXPECT(topo_inotify_rm_watch(fd, wd) == EINVAL, "rm_watch twice");
    rmdir(sub);
    rmdir(dir);
    close(fd);
}

int main(int argc, char **argv)
{
    test_parsers();
    test_small_buffer();
    test_mask_format();
    test_scan();
    test_inotify();
    test_scan_root("/");
    for (int i = 1; i < argc; i++)
        test_scan_root(argv[i]);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("test_native: ok\n");
    return 0;
}
