"""MIG GPU-instance profile tables for the GPU models topolet plans for, as plain data.

NVML profile ids, names, memory and SM fractions, per-GPU maxima and placements for A100, A100-80GB,
H100-80GB and H200-141GB.  H200 memory sizes are estimates, not verified.
Where each fact comes from (pynvml, NVIDIA's MIG User Guide, published listings): agent/gpu/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.api.resources import mig_resource_name

# NVML GPU-instance profile ids (pynvml NVML_GPU_INSTANCE_PROFILE_*).
GI_1_SLICE = 0
GI_2_SLICE = 1
GI_3_SLICE = 2
GI_4_SLICE = 3
GI_7_SLICE = 4
GI_1_SLICE_REV1 = 7
GI_1_SLICE_REV2 = 9

# NVML compute-instance profile id that fills a GPU instance of N compute slices.
CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """Where a GPU instance sits: `size` memory slices starting at memory slice `start`."""

    start: int
    size: int

    @property
    def mask(self) -> int:
        """Bitmask of the memory slices this placement occupies."""
        return ((1 << self.size) - 1) << self.start


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile of one GPU model."""

    name: str  # e.g. "3g.40gb"
    nvml_id: int  # NVML_GPU_INSTANCE_PROFILE_* (the enum passed to ...GetGpuInstanceProfileInfo)
    gi_profile_id: int  # the id that info returns and create/list calls take (nvidia-smi's "ID")
    compute_slices: int  # out of COMPUTE_SLICES
    memory_slices: int  # out of MEMORY_SLICES; equals every placement's size
    memory_mib: int  # NVML memorySizeMB
    multiprocessors: int
    max_count: int  # instances of this profile one GPU can hold
    placements: tuple[Placement, ...]

    @property
    def ci_profile_id(self) -> int:
        """NVML compute-instance profile that spans the whole GPU instance."""
        return CI_PROFILE_FOR_SLICES[self.compute_slices]

    @property
    def resource_name(self) -> str:
        """The Kubernetes extended resource the device plugin's mixed strategy exposes.

        '+' is not valid in a resource name, so "1g.10gb+me" becomes "mig-1g.10gb.me".
        """
        return mig_resource_name(self.name)


@dataclass(frozen=True)
class GPUModel:
    """A MIG-capable GPU model and its profile table."""

    name: str  # our key, e.g. "H100-80GB"
    product_names: tuple[str, ...]  # NVML names (nvmlDeviceGetName) of boards with this table
    profiles: tuple[Profile, ...]
    checked_on_hardware: bool
    memory_slices: int = MEMORY_SLICES
    compute_slices: int = COMPUTE_SLICES
    _by_name: dict[str, Profile] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.profiles})

    def profile(self, name: str) -> Profile:
        """The profile called `name`; KeyError when this model has none."""
        return self._by_name[name]

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    def profile_by_nvml_id(self, nvml_id: int) -> Profile:
        for p in self.profiles:
            if p.nvml_id == nvml_id:
                return p
        raise KeyError(nvml_id)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


_P1 = tuple(Placement(s, 1) for s in range(7))  # 1g: slices 0..6 (slice 7 takes no 1g instance)
_P1_DOUBLE = tuple(Placement(s, 2) for s in (0, 2, 4, 6))
_P2 = tuple(Placement(s, 2) for s in (0, 2, 4))
_P3 = (Placement(0, 4), Placement(4, 4))
_P4 = (Placement(0, 4),)
_P7 = (Placement(0, 8),)


def _table(mem_unit: str, mem_double: str, mem_half: str, mem_full: str,
           mib: tuple[int, int, int, int], sms: tuple[int, int, int, int, int, int]
           ) -> tuple[Profile, ...]:
    """Build the seven-profile table shared by A100/H100/H200 (only names, MiB and SMs differ)."""
    m1, m2, m4, m8 = mib
    s1, s1d, s2, s3, s4, s7 = sms
    return (
        Profile(f"1g.{mem_unit}", GI_1_SLICE, 19, 1, 1, m1, s1, 7, _P1),
        Profile(f"1g.{mem_unit}+me", GI_1_SLICE_REV1, 20, 1, 1, m1, s1, 1, _P1),
        Profile(f"1g.{mem_double}", GI_1_SLICE_REV2, 15, 1, 2, m2, s1d, 4, _P1_DOUBLE),
        Profile(f"2g.{mem_double}", GI_2_SLICE, 14, 2, 2, m2, s2, 3, _P2),
        Profile(f"3g.{mem_half}", GI_3_SLICE, 9, 3, 4, m4, s3, 2, _P3),
        Profile(f"4g.{mem_half}", GI_4_SLICE, 5, 4, 4, m4, s4, 1, _P4),
        Profile(f"7g.{mem_full}", GI_7_SLICE, 0, 7, 8, m8, s7, 1, _P7),
    )


A100_40GB = GPUModel(
    name="A100-40GB",
    product_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    profiles=_table("5gb", "10gb", "20gb", "40gb", (4864, 9856, 19968, 40192), (14, 14, 28, 42, 56, 98)),
    checked_on_hardware=False,
)
A100_80GB = GPUModel(
    name="A100-80GB",
    product_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    profiles=_table("10gb", "20gb", "40gb", "80gb", (9856, 19968, 40192, 80384), (14, 14, 28, 42, 56, 98)),
    checked_on_hardware=False,
)
H100_80GB = GPUModel(
    name="H100-80GB",
    product_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
    profiles=_table("10gb", "20gb", "40gb", "80gb", (9984, 20096, 40448, 81152), (16, 26, 32, 60, 64, 132)),
    checked_on_hardware=False,
)
H200_141GB = GPUModel(
    name="H200-141GB",
    product_names=("NVIDIA H200", "NVIDIA H200 NVL"),
    # MiB and SM counts are estimates; tests/device/h200_check.py compares them with a real board.
    profiles=_table("18gb", "35gb", "71gb", "141gb", (17920, 35840, 71936, 143872),
                    (16, 26, 32, 60, 64, 132)),
    checked_on_hardware=False,
)

MODELS: tuple[GPUModel, ...] = (A100_40GB, A100_80GB, H100_80GB, H200_141GB)


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def resolve_model(name: str) -> GPUModel | None:
    """The model for our key ("H100-80GB") or an NVML product name ("NVIDIA H100 80GB HBM3")."""
    key = _norm(name)
    for m in MODELS:
        if key == _norm(m.name) or any(key == _norm(p) for p in m.product_names):
            return m
    # Product names vary by form factor and driver; match on family and memory as a fallback.
    # H100 NVL (94 GB) and other variants have different tables, so they deliberately miss here.
    if "a100" in key:
        return A100_80GB if "80gb" in key else A100_40GB
    if "h100" in key and "nvl" not in key and ("80gb" in key or "pcie" in key or "sxm" in key):
        return H100_80GB
    if "h200" in key:
        return H200_141GB
    return None
