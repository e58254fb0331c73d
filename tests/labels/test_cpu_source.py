"""The cpu source against NFD's naming (source/cpu/cpu.go, klauspost/cpuid names, docs)."""

from __future__ import annotations

import pytest

from agent.labels import build_labels
from agent.labels.cpu import nfd_vendor
from agent.labels.cpuid_names import X86_CPUINFO_TO_NFD
from tests.labels.machines import cpu_info, empty_machine, machine

CPUID = "feature.node.kubernetes.io/cpu-cpuid."
MODEL = "feature.node.kubernetes.io/cpu-model."
SMT = "feature.node.kubernetes.io/cpu-hardware_multithreading"

# NFD's default cpuid blacklist (docs "Feature labels" and cpu.go newDefaultConfig).
NFD_DEFAULT_HIDDEN = {
    "AVX10", "BMI1", "BMI2", "CLMUL", "CMOV", "CX16", "ERMS", "F16C", "HTT", "LZCNT", "MMX",
    "MMXEXT", "NX", "POPCNT", "RDRAND", "RDSEED", "RDTSCP", "SGX", "SGXLC", "SSE", "SSE2", "SSE3",
    "SSE4", "SSE42", "SSSE3", "TDX_GUEST",
}


def cpuid_labels(flags: list[str], arch: str = "x86", vendor: str = "GenuineIntel") -> set[str]:
    labels = build_labels(empty_machine(cpu_info(flags, arch=arch, vendor=vendor)))
    return {k.removeprefix(CPUID) for k in labels if k.startswith(CPUID)}


@pytest.mark.parametrize(("flag", "label"), [
    ("avx512f", "AVX512F"),
    ("avx512_vnni", "AVX512VNNI"),
    ("avx512_bf16", "AVX512BF16"),
    ("avx512vbmi", "AVX512VBMI"),
    ("avx512_vbmi2", "AVX512VBMI2"),
    ("avx512_fp16", "AVX512FP16"),
    ("avx_vnni", "AVXVNNI"),
    ("amx_tile", "AMXTILE"),
    ("amx_bf16", "AMXBF16"),
    ("aes", "AESNI"),
    ("fma", "FMA3"),
    ("sha_ni", "SHA"),
    ("hypervisor", "HYPERVISOR"),
    ("vmx", "VMX"),
    ("svm", "SVM"),
    ("fpu", "X87"),
    ("cx8", "CMPXCHG8"),
    ("lahf_lm", "LAHF"),
    ("sep", "SYSEE"),
    ("gfni", "GFNI"),
    ("vpclmulqdq", "VPCLMULQDQ"),
    ("movdir64b", "MOVDIR64B"),
    ("sse4a", "SSE4A"),
    ("md_clear", "MD_CLEAR"),
    # Hidden by NFD's default blacklist:
    ("sse4_1", None), ("sse4_2", None), ("pni", None), ("ssse3", None), ("sse2", None),
    ("pclmulqdq", None), ("abm", None), ("popcnt", None), ("bmi1", None), ("bmi2", None),
    ("ht", None), ("nx", None), ("cmov", None), ("cx16", None), ("erms", None), ("f16c", None),
    ("rdrand", None), ("rdseed", None), ("rdtscp", None), ("mmx", None), ("sgx", None),
    ("tdx_guest", None),
    # Features klauspost/cpuid does not detect never get an NFD label:
    ("clflush", None), ("clflushopt", None), ("pge", None), ("x2apic", None), ("constant_tsc", None),
])
def test_x86_flag_names(flag: str, label: str | None) -> None:
    assert cpuid_labels([flag]) == ({label} if label else set())


@pytest.mark.parametrize(("flag", "label"), [
    ("fp", "FP"), ("asimd", "ASIMD"), ("aes", "AES"), ("sve", "SVE"), ("sve2", "SVE2"),
    ("asimdrdm", "ASIMDRDM"), ("cpuid", "CPUID"), ("i8mm", "I8MM"), ("bf16", "BF16"),
    ("smei16i64", "SMEI16I64"),
    ("neon", "NEON"), ("vfpv4", "VFPv4"), ("vfpv3d16", "VFPv3D16"), ("fastmult", "FASTMUL"),
    ("26bit", "26BIT"),
    ("avx2", None),  # an x86 name means nothing on arm
])
def test_arm_flag_names(flag: str, label: str | None) -> None:
    assert cpuid_labels([flag], arch="arm", vendor="0x41") == ({label} if label else set())


def test_every_blacklisted_name_stays_hidden() -> None:
    flags = [f for f, name in X86_CPUINFO_TO_NFD.items() if name in NFD_DEFAULT_HIDDEN]
    assert flags  # the table does cover hidden features
    assert cpuid_labels(flags) == set()


def test_whole_x86_table_yields_one_label_per_visible_name() -> None:
    visible = set(X86_CPUINFO_TO_NFD.values()) - NFD_DEFAULT_HIDDEN
    assert cpuid_labels(list(X86_CPUINFO_TO_NFD)) == visible


@pytest.mark.parametrize(("arch", "vendor"), [("power", "IBM"), ("s390", "IBM/S390"), ("", "")])
def test_no_cpuid_labels_without_a_known_table(arch: str, vendor: str) -> None:
    assert cpuid_labels(["avx2", "aes", "altivec", "vsx"], arch=arch, vendor=vendor) == set()


def test_missing_arch_falls_back_on_x86_vendor() -> None:
    assert cpuid_labels(["avx2"], arch="", vendor="AuthenticAMD") == {"AVX2"}


@pytest.mark.parametrize(("arch"), ["x86_64", "X86", "amd64", "i686"])
def test_x86_arch_spellings(arch: str) -> None:
    assert cpuid_labels(["avx2"], arch=arch) == {"AVX2"}


def test_flags_that_are_not_cpuinfo_names_are_ignored() -> None:
    assert cpuid_labels(["avx 512", "AVX2 ", "ü", "", "avx512f\n"]) == set()


def test_flag_case_does_not_matter() -> None:
    assert cpuid_labels(["AVX2"]) == {"AVX2"}


@pytest.mark.parametrize(("vendor", "nfd"), [
    ("GenuineIntel", "Intel"),
    ("AuthenticAMD", "AMD"),
    ("HygonGenuine", "Hygon"),
    ("CentaurHauls", "VIA"),
    ("VIA VIA VIA ", "VIA"),
    ("VIA VIA VIA", "VIA"),      # the trailing space lost on the way
    ("Genuine  RDC", "RDC"),
    ("0x41", "ARM"),
    ("0x4e", "NVIDIA"),
    ("0xc0", "Ampere"),
    ("0x51", "Qualcomm"),
    ("0x99", "VendorUnknown"),
    ("0xzz", "VendorUnknown"),
    ("arm", "ARM"),
    ("Some Vendor, Inc.", "VendorUnknown"),
    ("", "VendorUnknown"),
])
def test_vendor_names(vendor: str, nfd: str) -> None:
    assert nfd_vendor(vendor) == nfd
    labels = build_labels(empty_machine(cpu_info(vendor=vendor)))
    assert labels[MODEL + "vendor_id"] == nfd


def test_model_family_and_id() -> None:
    labels = build_labels(empty_machine(cpu_info(family=25, model=17)))
    assert labels[MODEL + "family"] == "25"
    assert labels[MODEL + "id"] == "17"


def test_unknown_family_and_model_are_left_out() -> None:
    labels = build_labels(empty_machine(cpu_info(family=-1, model=-1)))
    assert MODEL + "family" not in labels and MODEL + "id" not in labels


def test_hypervisor_none_on_bare_metal_and_absent_when_vendor_unknown() -> None:
    assert build_labels(empty_machine(cpu_info()))[MODEL + "hypervisor"] == "none"
    assert MODEL + "hypervisor" not in build_labels(empty_machine(cpu_info(hypervisor=True)))


@pytest.mark.parametrize(("threads", "value"), [(1, "false"), (2, "true"), (4, "true")])
def test_hardware_multithreading(threads: int, value: str) -> None:
    assert build_labels(machine(threads=threads))[SMT] == value


def test_hardware_multithreading_absent_without_cores() -> None:
    assert SMT not in build_labels(empty_machine())
