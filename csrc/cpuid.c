/* x86 cpuid on the running machine, with feature bits named as Linux's /proc/cpuinfo names them.
 * Bit positions are the architectural ones (Intel SDM vol. 2, AMD APM vol. 3); names follow the
 * kernel's cpuinfo spelling so they mix with flags read from a dump. */
#include <string.h>

#include "scan_ctx.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

enum { EAX, EBX, ECX, EDX };

struct feature {
    uint32_t leaf;
    uint32_t subleaf;
    uint8_t reg;
    uint8_t bit;
    const char *name;
};

static const struct feature features[] = {
    {1, 0, EDX, 0, "fpu"}, {1, 0, EDX, 1, "vme"}, {1, 0, EDX, 2, "de"}, {1, 0, EDX, 3, "pse"},
    {1, 0, EDX, 4, "tsc"}, {1, 0, EDX, 5, "msr"}, {1, 0, EDX, 6, "pae"}, {1, 0, EDX, 7, "mce"},
    {1, 0, EDX, 8, "cx8"}, {1, 0, EDX, 9, "apic"}, {1, 0, EDX, 11, "sep"}, {1, 0, EDX, 12, "mtrr"},
    {1, 0, EDX, 13, "pge"}, {1, 0, EDX, 14, "mca"}, {1, 0, EDX, 15, "cmov"}, {1, 0, EDX, 16, "pat"},
    {1, 0, EDX, 17, "pse36"}, {1, 0, EDX, 19, "clflush"}, {1, 0, EDX, 21, "dts"},
    {1, 0, EDX, 22, "acpi"}, {1, 0, EDX, 23, "mmx"}, {1, 0, EDX, 24, "fxsr"}, {1, 0, EDX, 25, "sse"},
    {1, 0, EDX, 26, "sse2"}, {1, 0, EDX, 27, "ss"}, {1, 0, EDX, 28, "ht"}, {1, 0, EDX, 29, "tm"},
    {1, 0, EDX, 31, "pbe"},

    {1, 0, ECX, 0, "pni"}, {1, 0, ECX, 1, "pclmulqdq"}, {1, 0, ECX, 2, "dtes64"},
    {1, 0, ECX, 3, "monitor"}, {1, 0, ECX, 4, "ds_cpl"}, {1, 0, ECX, 5, "vmx"}, {1, 0, ECX, 6, "smx"},
    {1, 0, ECX, 7, "est"}, {1, 0, ECX, 8, "tm2"}, {1, 0, ECX, 9, "ssse3"}, {1, 0, ECX, 10, "cid"},
    {1, 0, ECX, 11, "sdbg"}, {1, 0, ECX, 12, "fma"}, {1, 0, ECX, 13, "cx16"}, {1, 0, ECX, 14, "xtpr"},
    {1, 0, ECX, 15, "pdcm"}, {1, 0, ECX, 17, "pcid"}, {1, 0, ECX, 18, "dca"},
    {1, 0, ECX, 19, "sse4_1"}, {1, 0, ECX, 20, "sse4_2"}, {1, 0, ECX, 21, "x2apic"},
    {1, 0, ECX, 22, "movbe"}, {1, 0, ECX, 23, "popcnt"}, {1, 0, ECX, 24, "tsc_deadline_timer"},
    {1, 0, ECX, 25, "aes"}, {1, 0, ECX, 26, "xsave"}, {1, 0, ECX, 28, "avx"}, {1, 0, ECX, 29, "f16c"},
    {1, 0, ECX, 30, "rdrand"}, {1, 0, ECX, 31, "hypervisor"},

    {7, 0, EBX, 0, "fsgsbase"}, {7, 0, EBX, 1, "tsc_adjust"}, {7, 0, EBX, 2, "sgx"},
    {7, 0, EBX, 3, "bmi1"}, {7, 0, EBX, 4, "hle"}, {7, 0, EBX, 5, "avx2"},
    {7, 0, EBX, 6, "fdp_excptn_only"}, {7, 0, EBX, 7, "smep"}, {7, 0, EBX, 8, "bmi2"},
    {7, 0, EBX, 9, "erms"}, {7, 0, EBX, 10, "invpcid"}, {7, 0, EBX, 11, "rtm"},
    {7, 0, EBX, 14, "mpx"}, {7, 0, EBX, 15, "rdt_a"}, {7, 0, EBX, 16, "avx512f"},
    {7, 0, EBX, 17, "avx512dq"}, {7, 0, EBX, 18, "rdseed"}, {7, 0, EBX, 19, "adx"},
    {7, 0, EBX, 20, "smap"}, {7, 0, EBX, 21, "avx512ifma"}, {7, 0, EBX, 23, "clflushopt"},
    {7, 0, EBX, 24, "clwb"}, {7, 0, EBX, 25, "intel_pt"}, {7, 0, EBX, 26, "avx512pf"},
    {7, 0, EBX, 27, "avx512er"}, {7, 0, EBX, 28, "avx512cd"}, {7, 0, EBX, 29, "sha_ni"},
    {7, 0, EBX, 30, "avx512bw"}, {7, 0, EBX, 31, "avx512vl"},

    {7, 0, ECX, 1, "avx512vbmi"}, {7, 0, ECX, 2, "umip"}, {7, 0, ECX, 3, "pku"},
    {7, 0, ECX, 4, "ospke"}, {7, 0, ECX, 5, "waitpkg"}, {7, 0, ECX, 6, "avx512_vbmi2"},
    {7, 0, ECX, 8, "gfni"}, {7, 0, ECX, 9, "vaes"}, {7, 0, ECX, 10, "vpclmulqdq"},
    {7, 0, ECX, 11, "avx512_vnni"}, {7, 0, ECX, 12, "avx512_bitalg"}, {7, 0, ECX, 13, "tme"},
    {7, 0, ECX, 14, "avx512_vpopcntdq"}, {7, 0, ECX, 16, "la57"}, {7, 0, ECX, 22, "rdpid"},
    {7, 0, ECX, 24, "bus_lock_detect"}, {7, 0, ECX, 25, "cldemote"}, {7, 0, ECX, 27, "movdiri"},
    {7, 0, ECX, 28, "movdir64b"}, {7, 0, ECX, 29, "enqcmd"}, {7, 0, ECX, 30, "sgx_lc"},

    {7, 0, EDX, 2, "avx512_4vnniw"}, {7, 0, EDX, 3, "avx512_4fmaps"}, {7, 0, EDX, 4, "fsrm"},
    {7, 0, EDX, 8, "avx512_vp2intersect"}, {7, 0, EDX, 10, "md_clear"},
    {7, 0, EDX, 14, "serialize"}, {7, 0, EDX, 15, "hybrid_cpu"}, {7, 0, EDX, 16, "tsxldtrk"},
    {7, 0, EDX, 18, "pconfig"}, {7, 0, EDX, 19, "arch_lbr"}, {7, 0, EDX, 20, "ibt"},
    {7, 0, EDX, 22, "amx_bf16"}, {7, 0, EDX, 23, "avx512_fp16"}, {7, 0, EDX, 24, "amx_tile"},
    {7, 0, EDX, 25, "amx_int8"}, {7, 0, EDX, 27, "stibp"}, {7, 0, EDX, 28, "flush_l1d"},
    {7, 0, EDX, 29, "arch_capabilities"},

    {7, 1, EAX, 4, "avx_vnni"}, {7, 1, EAX, 5, "avx512_bf16"},

    {0xd, 1, EAX, 0, "xsaveopt"}, {0xd, 1, EAX, 1, "xsavec"}, {0xd, 1, EAX, 2, "xgetbv1"},
    {0xd, 1, EAX, 3, "xsaves"},

    {0x80000001, 0, ECX, 0, "lahf_lm"}, {0x80000001, 0, ECX, 1, "cmp_legacy"},
    {0x80000001, 0, ECX, 2, "svm"}, {0x80000001, 0, ECX, 3, "extapic"},
    {0x80000001, 0, ECX, 4, "cr8_legacy"}, {0x80000001, 0, ECX, 5, "abm"},
    {0x80000001, 0, ECX, 6, "sse4a"}, {0x80000001, 0, ECX, 7, "misalignsse"},
    {0x80000001, 0, ECX, 8, "3dnowprefetch"}, {0x80000001, 0, ECX, 9, "osvw"},
    {0x80000001, 0, ECX, 10, "ibs"}, {0x80000001, 0, ECX, 11, "xop"},
    {0x80000001, 0, ECX, 12, "skinit"}, {0x80000001, 0, ECX, 13, "wdt"},
    {0x80000001, 0, ECX, 15, "lwp"}, {0x80000001, 0, ECX, 16, "fma4"},
    {0x80000001, 0, ECX, 17, "tce"}, {0x80000001, 0, ECX, 19, "nodeid_msr"},
    {0x80000001, 0, ECX, 21, "tbm"}, {0x80000001, 0, ECX, 22, "topoext"},
    {0x80000001, 0, ECX, 23, "perfctr_core"}, {0x80000001, 0, ECX, 24, "perfctr_nb"},
    {0x80000001, 0, ECX, 26, "bpext"}, {0x80000001, 0, ECX, 27, "ptsc"},
    {0x80000001, 0, ECX, 28, "perfctr_llc"}, {0x80000001, 0, ECX, 29, "mwaitx"},

    {0x80000001, 0, EDX, 11, "syscall"}, {0x80000001, 0, EDX, 20, "nx"},
    {0x80000001, 0, EDX, 22, "mmxext"}, {0x80000001, 0, EDX, 25, "fxsr_opt"},
    {0x80000001, 0, EDX, 26, "pdpe1gb"}, {0x80000001, 0, EDX, 27, "rdtscp"},
    {0x80000001, 0, EDX, 29, "lm"}, {0x80000001, 0, EDX, 30, "3dnowext"},
    {0x80000001, 0, EDX, 31, "3dnow"},

    {0x80000008, 0, EBX, 0, "clzero"}, {0x80000008, 0, EBX, 1, "irperf"},
    {0x80000008, 0, EBX, 2, "xsaveerptr"}, {0x80000008, 0, EBX, 9, "wbnoinvd"},
};

static void query(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __cpuid_count(leaf, sub, r[EAX], r[EBX], r[ECX], r[EDX]);
}

static int supported(uint32_t leaf, uint32_t max_basic, uint32_t max_ext)
{
    return leaf >= 0x80000000u ? leaf <= max_ext : leaf <= max_basic;
}

int cpuid_probe(char vendor[13], int *family, int *model, char brand[49], int *hypervisor,
                char *flags, size_t flags_cap)
{
    uint32_t r[4], max_basic, max_ext, base_family;
    size_t n = 0;

    query(0, 0, r);
    max_basic = r[EAX];
    memcpy(vendor, &r[EBX], 4);
    memcpy(vendor + 4, &r[EDX], 4);
    memcpy(vendor + 8, &r[ECX], 4);
    vendor[12] = '\0';
    query(0x80000000u, 0, r);
    max_ext = r[EAX];

    *family = *model = -1;
    *hypervisor = 0;
    if (max_basic >= 1) {
        query(1, 0, r);
        base_family = r[EAX] >> 8 & 0xf;
        *family = (int)base_family;
        *model = (int)(r[EAX] >> 4 & 0xf);
        if (base_family == 0xf)
            *family += (int)(r[EAX] >> 20 & 0xff);
        if (base_family == 0x6 || base_family == 0xf)
            *model += (int)(r[EAX] >> 16 & 0xf) << 4;
        *hypervisor = (int)(r[ECX] >> 31 & 1);
    }

    brand[0] = '\0';
    if (max_ext >= 0x80000004u) {
        char raw[49];
        const char *b = raw;
        for (uint32_t i = 0; i < 3; i++) {
            query(0x80000002u + i, 0, r);
            memcpy(raw + 16 * i, r, 16);
        }
        raw[48] = '\0';
        while (*b == ' ')
            b++;
        memmove(brand, b, strlen(b) + 1);
    }

    flags[0] = '\0';
    /* the table is grouped by leaf: query each (leaf, subleaf) once, cpuid traps under a VM */
    uint32_t have_leaf = 0, have_sub = UINT32_MAX;
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        const struct feature *f = &features[i];
        size_t len;
        if (!supported(f->leaf, max_basic, max_ext))
            continue;
        if (f->leaf != have_leaf || f->subleaf != have_sub) {
            query(f->leaf, f->subleaf, r);
            have_leaf = f->leaf;
            have_sub = f->subleaf;
        }
        if (!(r[f->reg] >> f->bit & 1))
            continue;
        len = strlen(f->name);
        if (n + len + 2 > flags_cap)
            break;
        if (n)
            flags[n++] = ' ';
        memcpy(flags + n, f->name, len + 1);
        n += len;
    }
    return 1;
}

#else

int cpuid_probe(char vendor[13], int *family, int *model, char brand[49], int *hypervisor,
                char *flags, size_t flags_cap)
{
    (void)vendor; (void)family; (void)model; (void)brand; (void)hypervisor; (void)flags;
    (void)flags_cap;
    return 0;
}

#endif
