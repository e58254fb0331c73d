/* /proc/cpuinfo: vendor, family, model, name and feature flags, whatever shape the architecture
 * writes; on the host's x86 the cpuid instruction supplies (and extends) the same facts. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "scan_ctx.h"

struct field {
    const char *v;
    size_t n;
};

struct cpuinfo {
    struct field vendor_id, vendor, cpu_family, family, model, model_name, processor_name, cpu,
        flags, features_upper, features_lower, implementer, architecture, part, arch, isa, uarch,
        revision, nprocessors, clock;
};

/* Keys as the kernel writes them per architecture; the first occurrence of each wins. */
static struct field *slot_for(struct cpuinfo *ci, const char *key, size_t n)
{
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"vendor_id", offsetof(struct cpuinfo, vendor_id)},
        {"vendor", offsetof(struct cpuinfo, vendor)},
        {"cpu family", offsetof(struct cpuinfo, cpu_family)},
        {"family", offsetof(struct cpuinfo, family)},
        {"model", offsetof(struct cpuinfo, model)},
        {"model name", offsetof(struct cpuinfo, model_name)},
        {"Processor", offsetof(struct cpuinfo, processor_name)},
        {"cpu", offsetof(struct cpuinfo, cpu)},
        {"flags", offsetof(struct cpuinfo, flags)},
        {"Features", offsetof(struct cpuinfo, features_upper)},
        {"features", offsetof(struct cpuinfo, features_lower)},
        {"CPU implementer", offsetof(struct cpuinfo, implementer)},
        {"CPU architecture", offsetof(struct cpuinfo, architecture)},
        {"CPU part", offsetof(struct cpuinfo, part)},
        {"arch", offsetof(struct cpuinfo, arch)},
        {"isa", offsetof(struct cpuinfo, isa)},
        {"uarch", offsetof(struct cpuinfo, uarch)},
        {"revision", offsetof(struct cpuinfo, revision)},
        {"# processors", offsetof(struct cpuinfo, nprocessors)},
        {"clock", offsetof(struct cpuinfo, clock)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i].key) == n && memcmp(keys[i].key, key, n) == 0)
            return (struct field *)((char *)ci + keys[i].off);
    return NULL;
}

static void parse_lines(struct cpuinfo *ci, const char *text, size_t len)
{
    const char *p = text, *end = text + len;

    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p)), *colon, *k_end, *v;
        struct field *f;
        if (eol == NULL)
            eol = end;
        colon = memchr(p, ':', (size_t)(eol - p));
        if (colon) {
            k_end = colon;
            while (k_end > p && (k_end[-1] == ' ' || k_end[-1] == '\t'))
                k_end--;
            v = colon + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            f = slot_for(ci, p, (size_t)(k_end - p));
            if (f && f->v == NULL) {
                const char *ve = eol;
                while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t' || ve[-1] == '\r' || ve[-1] == '\0'))
                    ve--;
                f->v = v;
                f->n = (size_t)(ve - v);
            }
        }
        p = eol + 1;
    }
}

static int has_prefix(struct field f, const char *prefix)
{
    size_t n = strlen(prefix);
    return f.v && f.n >= n && memcmp(f.v, prefix, n) == 0;
}

static int field_int(struct field f, int base, int *out)
{
    char tmp[32], *endp;
    long v;
    if (f.v == NULL || f.n == 0 || f.n >= sizeof tmp)
        return 0;
    memcpy(tmp, f.v, f.n);
    tmp[f.n] = '\0';
    errno = 0;
    v = strtol(tmp, &endp, base);
    if (errno || *endp != '\0' || v < 0 || v > 0x7fffffff)
        return 0;
    *out = (int)v;
    return 1;
}

static int32_t add_field(struct scan_ctx *ctx, struct field f)
{
    return f.v ? scan_add_string(ctx, f.v, f.n) : 0;
}

static int has_word(const char *s, size_t n, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl <= n; i++)
        if ((i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t') && memcmp(s + i, word, wl) == 0 &&
            (i + wl == n || s[i + wl] == ' ' || s[i + wl] == '\t'))
            return 1;
    return 0;
}

/* ARM "CPU implementer" codes (from the Arm ARM's MIDR_EL1 table) to vendor names. */
static const char *arm_vendor(int code)
{
    switch (code) {
    case 0x41: return "ARM";
    case 0x42: return "Broadcom";
    case 0x43: return "Cavium";
    case 0x46: return "Fujitsu";
    case 0x48: return "HiSilicon";
    case 0x4e: return "NVIDIA";
    case 0x50: return "APM";
    case 0x51: return "Qualcomm";
    case 0x53: return "Samsung";
    case 0x56: return "Marvell";
    case 0x61: return "Apple";
    case 0x69: return "Intel";
    case 0xc0: return "Ampere";
    default: return NULL;
    }
}

static const char *arch_from_uname(void)
{
    static struct utsname u;
    if (uname(&u) != 0)
        return "";
    if (!strcmp(u.machine, "x86_64") || (u.machine[0] == 'i' && !strcmp(u.machine + 2, "86")))
        return "x86";
    if (!strncmp(u.machine, "aarch64", 7) || !strncmp(u.machine, "arm", 3))
        return "arm";
    if (!strncmp(u.machine, "ppc", 3))
        return "power";
    if (!strncmp(u.machine, "s390", 4))
        return "s390";
    if (!strncmp(u.machine, "riscv", 5))
        return "riscv";
    return u.machine;
}

void scan_cpuinfo(struct scan_ctx *ctx)
{
    struct cpuinfo ci;
    struct field flags = {NULL, 0};
    const char *arch = "";
    size_t len;
    int err, v;
    /* cpuid covers the host's x86: the first processor block of cpuinfo is enough */
    int host_x86 = 0;
#if defined(__x86_64__) || defined(__i386__)
    host_x86 = ctx->is_host;
#endif

    memset(&ci, 0, sizeof ci);
    err = scan_read_root(ctx, "proc/cpuinfo", &len, host_x86 ? SCAN_FIRST_BLOCK : 1);
    if (err && err != ENOENT)
        scan_add_error(ctx, err, "proc/cpuinfo", NULL);
    if (err)
        len = 0;
    parse_lines(&ci, ctx->buf, len);

    if (has_prefix(ci.vendor_id, "IBM/S390") || ci.nprocessors.v) {
        arch = "s390";
        flags = ci.features_lower;
    } else if (ci.cpu_family.v || (ci.vendor_id.v && ci.flags.v)) {
        arch = "x86";
        flags = ci.flags;
    } else if (has_prefix(ci.arch, "IA-64") || (ci.vendor.v && ci.family.v)) {
        arch = "ia64";
    } else if (ci.implementer.v || ci.features_upper.v) {
        arch = "arm";
        flags = ci.features_upper;
    } else if (ci.isa.v) {
        arch = "riscv";
    } else if (ci.cpu.v && (ci.clock.v || (ci.revision.v && memmem(ci.revision.v, ci.revision.n,
                                                                    "pvr", 3)))) {
        arch = "power";
    } else if (ctx->is_host) {
        arch = arch_from_uname();
    }
    ctx->pub.arch = scan_add_string(ctx, arch, strlen(arch));

    if (ci.vendor_id.v)
        ctx->pub.cpu_vendor = add_field(ctx, ci.vendor_id);
    else if (ci.vendor.v)
        ctx->pub.cpu_vendor = add_field(ctx, ci.vendor);
    else if (field_int(ci.implementer, 0, &v) && arm_vendor(v))
        ctx->pub.cpu_vendor = scan_add_string(ctx, arm_vendor(v), strlen(arm_vendor(v)));

    if (field_int(ci.cpu_family, 10, &v) || field_int(ci.family, 10, &v) ||
        field_int(ci.architecture, 10, &v))
        ctx->pub.cpu_family = v;
    if (field_int(ci.model, 10, &v) || field_int(ci.part, 0, &v))
        ctx->pub.cpu_model = v;

    if (ci.model_name.v)
        ctx->pub.cpu_model_name = add_field(ctx, ci.model_name);
    else if (ci.processor_name.v)
        ctx->pub.cpu_model_name = add_field(ctx, ci.processor_name);
    else if (ci.cpu.v)
        ctx->pub.cpu_model_name = add_field(ctx, ci.cpu);
    else if (ci.uarch.v)
        ctx->pub.cpu_model_name = add_field(ctx, ci.uarch);
    else if (ci.family.v && !ci.cpu_family.v)
        ctx->pub.cpu_model_name = add_field(ctx, ci.family); /* ia64: "Itanium 2" */

    ctx->pub.hypervisor = flags.v && has_word(flags.v, flags.n, "hypervisor");

    if (host_x86) {
        char vendor[13], brand[49], *cpuid_flags;
        int family, model, hv;
        size_t cap = 8192, fl = flags.v ? flags.n : 0;
        cpuid_flags = malloc(cap + fl + 2);
        if (cpuid_flags == NULL) {
            ctx->oom = 1;
            return;
        }
        if (cpuid_probe(vendor, &family, &model, brand, &hv, cpuid_flags, cap)) {
            size_t n = strlen(cpuid_flags);
            ctx->pub.cpu_vendor = scan_add_string(ctx, vendor, strlen(vendor));
            ctx->pub.cpu_family = family;
            ctx->pub.cpu_model = model;
            if (!ctx->pub.cpu_model_name && brand[0])
                ctx->pub.cpu_model_name = scan_add_string(ctx, brand, strlen(brand));
            ctx->pub.hypervisor |= hv;
            /* the kernel's flags (with its synthetic ones) plus what cpuid reports */
            if (fl) {
                cpuid_flags[n++] = ' ';
                memcpy(cpuid_flags + n, flags.v, fl);
                n += fl;
            }
            ctx->pub.cpu_flags = scan_add_string(ctx, cpuid_flags, n);
            free(cpuid_flags);
            return;
        }
        free(cpuid_flags);
    }
    if (flags.v)
        ctx->pub.cpu_flags = add_field(ctx, flags);
}
