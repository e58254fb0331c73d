"""NFD's names for CPU features and vendors, keyed by what Linux shows in /proc/cpuinfo.

Facts, with their origin (kubernetes-sigs/node-feature-discovery, read 2025):
- x86: NFD labels `cpu-cpuid.<ID>` for every feature klauspost/cpuid v2 detects, named by that
  library's `FeatureID` identifiers (cpuid.go; e.g. SSE4 is SSE4.1, SSE42 is SSE4.2, FMA3, AESNI,
  CLMUL).  The map below translates the kernel's flag names (arch/x86 cpufeatures.h) to those
  identifiers.  Flags the library does not know (clflush, clflushopt, pge, ...) get no NFD label.
- arm64 / arm: NFD names the AT_HWCAP/AT_HWCAP2 bits itself (source/cpu/cpuid_linux_arm64.go,
  cpuid_linux_arm.go): the kernel's names upper-cased, except the spellings listed below.
- POWER and s390 features come from hwcaps that /proc/cpuinfo does not list, so none are mapped.
- Hidden by default (source/cpu/cpu.go newDefaultConfig, AttributeBlacklist; docs "Feature
  labels"): see `NFD_CPUID_BLACKLIST`.
- Vendors: NFD's `cpu-model.vendor_id` is klauspost/cpuid's `Vendor` name (vendorMapping for
  the x86 CPUID vendor string; the MIDR implementer byte on arm64).  Unrecognized vendors are
  reported as "VendorUnknown", the library's name for that case.
"""

from __future__ import annotations

NFD_CPUID_BLACKLIST: frozenset[str] = frozenset({
    "AVX10", "BMI1", "BMI2", "CLMUL", "CMOV", "CX16", "ERMS", "F16C", "HTT", "LZCNT", "MMX",
    "MMXEXT", "NX", "POPCNT", "RDRAND", "RDSEED", "RDTSCP", "SGX", "SGXLC", "SSE", "SSE2", "SSE3",
    "SSE4", "SSE42", "SSSE3", "TDX_GUEST",
})

# /proc/cpuinfo flag -> klauspost/cpuid FeatureID name, as NFD labels it on x86.
X86_CPUINFO_TO_NFD: dict[str, str] = {
    "3dnow": "AMD3DNOW",
    "3dnowext": "AMD3DNOWEXT",
    "abm": "LZCNT",
    "adx": "ADX",
    "aes": "AESNI",
    "amd_ppin": "PPIN",
    "amx_bf16": "AMXBF16",
    "amx_complex": "AMXCOMPLEX",
    "amx_fp16": "AMXFP16",
    "amx_int8": "AMXINT8",
    "amx_tile": "AMXTILE",
    "arch_capabilities": "IA32_ARCH_CAP",
    "avx": "AVX",
    "avx2": "AVX2",
    "avx512_bf16": "AVX512BF16",
    "avx512_bitalg": "AVX512BITALG",
    "avx512_fp16": "AVX512FP16",
    "avx512_vbmi2": "AVX512VBMI2",
    "avx512_vnni": "AVX512VNNI",
    "avx512_vp2intersect": "AVX512VP2INTERSECT",
    "avx512_vpopcntdq": "AVX512VPOPCNTDQ",
    "avx512bw": "AVX512BW",
    "avx512cd": "AVX512CD",
    "avx512dq": "AVX512DQ",
    "avx512er": "AVX512ER",
    "avx512f": "AVX512F",
    "avx512ifma": "AVX512IFMA",
    "avx512pf": "AVX512PF",
    "avx512vbmi": "AVX512VBMI",
    "avx512vl": "AVX512VL",
    "avx_ifma": "AVXIFMA",
    "avx_ne_convert": "AVXNECONVERT",
    "avx_vnni": "AVXVNNI",
    "avx_vnni_int16": "AVXVNNIINT16",
    "avx_vnni_int8": "AVXVNNIINT8",
    "bhi_ctrl": "BHI_CTRL",
    "bmi1": "BMI1",
    "bmi2": "BMI2",
    "cldemote": "CLDEMOTE",
    "clzero": "CLZERO",
    "cmov": "CMOV",
    "cmpccxadd": "CMPCCXADD",
    "core_capabilities": "IA32_CORE_CAP",
    "cpb": "CPBOOST",
    "cppc": "CPPC",
    "cx16": "CX16",
    "cx8": "CMPXCHG8",
    "decodeassists": "SVMDA",
    "enqcmd": "ENQCMD",
    "erms": "ERMS",
    "f16c": "F16C",
    "flush_l1d": "FLUSH_L1D",
    "flushbyasid": "SVMFBASID",
    "fma": "FMA3",
    "fma4": "FMA4",
    "fpu": "X87",
    "fsrm": "FSRM",
    "fxsr": "FXSR",
    "fxsr_opt": "FXSROPT",
    "gfni": "GFNI",
    "hle": "HLE",
    "hreset": "HRESET",
    "ht": "HTT",
    "hybrid_cpu": "HYBRID_CPU",
    "hypervisor": "HYPERVISOR",
    "ibpb": "IBPB",
    "ibrs": "IBRS",
    "ibs": "IBS",
    "ibt": "CETIBT",
    "intel_ppin": "PPIN",
    "invlpgb": "INVLPGB",
    "ipred_ctrl": "IDPRED_CTRL",
    "lahf_lm": "LAHF",
    "lam": "LAM",
    "lbrv": "LBRVIRT",
    "mcommit": "MCOMMIT",
    "md_clear": "MD_CLEAR",
    "mmx": "MMX",
    "mmxext": "MMXEXT",
    "movbe": "MOVBE",
    "movdir64b": "MOVDIR64B",
    "movdiri": "MOVDIRI",
    "mpx": "MPX",
    "msrlist": "MSRLIST",
    "npt": "SVMNP",
    "nrip_save": "NRIPS",
    "nx": "NX",
    "osxsave": "OSXSAVE",
    "overflow_recov": "MCAOVERFLOW",
    "pausefilter": "SVMPF",
    "pclmulqdq": "CLMUL",
    "pconfig": "PCONFIG",
    "pfthreshold": "SVMPFT",
    "pni": "SSE3",
    "popcnt": "POPCNT",
    "prefetchi": "PREFETCHI",
    "psfd": "PSFD",
    "rdpru": "RDPRU",
    "rdrand": "RDRAND",
    "rdseed": "RDSEED",
    "rdtscp": "RDTSCP",
    "rrsba_ctrl": "RRSBA_CTRL",
    "rtm": "RTM",
    "rtm_always_abort": "RTM_ALWAYS_ABORT",
    "sbpb": "SBPB",
    "sep": "SYSEE",
    "serialize": "SERIALIZE",
    "sev": "SEV",
    "sev_es": "SEV_ES",
    "sev_snp": "SEV_SNP",
    "sgx": "SGX",
    "sgx_lc": "SGXLC",
    "sha_ni": "SHA",
    "sme": "SME",
    "spec_ctrl_ssbd": "SPEC_CTRL_SSBD",
    "srbds_ctrl": "SRBDS_CTRL",
    "srso_no": "SRSO_NO",
    "sse": "SSE",
    "sse2": "SSE2",
    "sse4_1": "SSE4",
    "sse4_2": "SSE42",
    "sse4a": "SSE4A",
    "ssse3": "SSSE3",
    "stibp": "STIBP",
    "succor": "SUCCOR",
    "svm": "SVM",
    "svm_lock": "SVML",
    "syscall": "SYSCALL",
    "tbm": "TBM",
    "tdx_guest": "TDX_GUEST",
    "tme": "TME",
    "topoext": "TOPEXT",
    "tsc_scale": "TSCRATEMSR",
    "tsxldtrk": "TSXLDTRK",
    "vaes": "VAES",
    "vmcb_clean": "VMCBCLEAN",
    "vmx": "VMX",
    "vpclmulqdq": "VPCLMULQDQ",
    "vte": "VTE",
    "waitpkg": "WAITPKG",
    "wbnoinvd": "WBNOINVD",
    "wrmsrns": "WRMSRNS",
    "xgetbv1": "XGETBV1",
    "xop": "XOP",
    "xsave": "XSAVE",
    "xsavec": "XSAVEC",
    "xsaveopt": "XSAVEOPT",
    "xsaves": "XSAVES",
}

# arm64 AT_HWCAP/AT_HWCAP2 names as /proc/cpuinfo "Features" lists them; NFD upper-cases each.
_ARM64_HWCAPS = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
    "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg "
    "dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm "
    "svebf16 i8mm bf16 dgh rng bti mte ecv afp rpres mte3 sme smei16i64 smef64f64 smei8i32 "
    "smef16f32 smeb16f32 smef32f32 smefa64 wfxt ebf16 sveebf16"
)
# 32-bit arm hwcaps; NFD spells a few differently from the kernel.
_ARM32_HWCAPS = (
    "swp half thumb 26bit fpa vfp edsp java iwmmxt crunch thumbee neon tls idiva idivt vfpd32 "
    "lpae evtstrm aes pmull sha1 sha2 crc32"
)
ARM_CPUINFO_TO_NFD: dict[str, str] = {
    **{name: name.upper() for name in (_ARM64_HWCAPS + " " + _ARM32_HWCAPS).split()},
    "fastmult": "FASTMUL",
    "vfpv3": "VFPv3",
    "vfpv3d16": "VFPv3D16",
    "vfpv4": "VFPv4",
}

# x86 CPUID vendor string -> klauspost/cpuid Vendor name.
X86_VENDORS: dict[str, str] = {
    "AMDisbetter!": "AMD",
    "AuthenticAMD": "AMD",
    "CentaurHauls": "VIA",
    "GenuineIntel": "Intel",
    "TransmetaCPU": "Transmeta",
    "GenuineTMx86": "Transmeta",
    "Geode by NSC": "NSC",
    "VIA VIA VIA ": "VIA",
    "HygonGenuine": "Hygon",
    "Vortex86 SoC": "SiS",
    "SiS SiS SiS ": "SiS",
    "RiseRiseRise": "SiS",
    "Genuine  RDC": "RDC",
}

# Arm MIDR implementer byte (/proc/cpuinfo "CPU implementer") -> klauspost/cpuid Vendor name.
ARM_IMPLEMENTERS: dict[int, str] = {
    0x41: "ARM",
    0x42: "Broadcom",
    0x43: "Cavium",
    0x44: "DEC",
    0x46: "Fujitsu",
    0x49: "Infineon",
    0x4D: "Motorola",
    0x4E: "NVIDIA",
    0x50: "AMCC",
    0x51: "Qualcomm",
    0x56: "Marvell",
    0xC0: "Ampere",
}

VENDOR_UNKNOWN = "VendorUnknown"
KNOWN_VENDOR_NAMES: frozenset[str] = frozenset(X86_VENDORS.values()) | frozenset(
    ARM_IMPLEMENTERS.values())
