"""Build sysfs trees modelled on real 8-GPU HGX nodes (two sockets, one NUMA node and four GPUs each).

The trees hold what the C helper's scan needs (`agent.topology.discover.discover(root)`): a CPU and
NUMA-node tree, and PCI functions with `class`, `vendor`, `device`, `numa_node` and `local_cpulist`.
As on a real machine, `sys/bus/pci/devices/<address>` is a symlink into `sys/devices/pci*/`, unless
`links=False` asks for plain folders.
"""

from __future__ import annotations

from pathlib import Path

# (bus, NUMA node) for the eight GPUs: the layout of an HGX H100 board in a two-socket server.
HGX_GPUS = (("18", 0), ("2a", 0), ("3a", 0), ("5d", 0), ("9a", 1), ("ab", 1), ("ba", 1), ("db", 1))
NODE_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}
CORES_PER_SOCKET = 56
NVSWITCHES = (("05", 0), ("06", 0), ("85", 1), ("86", 1))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cpu_tree(root: Path, sockets: int = 2, cores_per_socket: int = CORES_PER_SOCKET) -> Path:
    """Online CPUs, two threads per core (siblings a machine's worth of cores apart), a node per socket."""
    cpu = root / "sys/devices/system/cpu"
    cores = sockets * cores_per_socket
    last = 2 * cores - 1
    for name in ("possible", "present", "online"):
        _write(cpu / name, f"0-{last}\n")
    for c in range(2 * cores):
        core = c % cores
        socket = core // cores_per_socket
        topo = cpu / f"cpu{c}/topology"
        _write(topo / "physical_package_id", f"{socket}\n")
        _write(topo / "core_id", f"{core % cores_per_socket}\n")
        _write(topo / "thread_siblings_list", f"{core},{core + cores}\n")
    for s in range(sockets):
        first, stop = s * cores_per_socket, (s + 1) * cores_per_socket - 1
        node = root / f"sys/devices/system/node/node{s}"
        _write(node / "cpulist", f"{first}-{stop},{first + cores}-{stop + cores}\n")
        _write(node / "distance", " ".join("10" if t == s else "21" for t in range(sockets)) + "\n")
    _write(root / "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
           "model\t\t: 143\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx2\n\n")
    return root


def pci_function(root: Path, address: str, *, vendor: int | None, device: int, pci_class: int,
                 numa: int | None, cpus: str, links: bool = True) -> Path:
    """One PCI function; `vendor` or `numa` None leaves that file out (as some kernels and dumps do)."""
    devices = root / "sys/bus/pci/devices"
    devices.mkdir(parents=True, exist_ok=True)
    if links:
        # Behind a root port, as the kernel nests them: devices/pci0000:00/0000:00:01.0/<address>
        parent = f"pci{address[:4]}:00/{address[:4]}:00:01.0"
        dev = root / "sys/devices" / parent / address
        dev.mkdir(parents=True)
        (devices / address).symlink_to(f"../../../devices/{parent}/{address}")
    else:
        dev = devices / address
        dev.mkdir()
    if vendor is not None:
        (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "device").write_text(f"0x{device:04x}\n")
    (dev / "class").write_text(f"0x{pci_class:06x}\n")
    if numa is not None:
        (dev / "numa_node").write_text(f"{numa}\n")
    (dev / "local_cpulist").write_text(f"{cpus}\n")
    return dev


def build_hgx(root: Path, *, device: int = 0x2330, name: str = "NVIDIA H100 80GB HBM3",
              with_proc: bool = True, numa: str = "known", links: bool = True) -> Path:
    """An 8-GPU node under `root`: CPUs, GPUs, NVSwitches (class 0x0680), a NIC and a host bridge.

    `numa` is "known" (numa_node files say 0 or 1), "minus-one" (they say -1, as some kernels do), or
    "spanning" (-1 and local CPUs covering both sockets: the locality is truly unknown).
    """
    cpu_tree(root)
    every = f"0-{4 * CORES_PER_SOCKET - 1}"
    for i, (bus, node) in enumerate(HGX_GPUS):
        address = f"0000:{bus}:00.0"
        pci_function(root, address, vendor=0x10DE, device=device, pci_class=0x030200,
                     numa=node if numa == "known" else -1,
                     cpus=every if numa == "spanning" else NODE_CPUS[node], links=links)
        if with_proc:
            info = root / "proc/driver/nvidia/gpus" / address
            info.mkdir(parents=True)
            (info / "information").write_text(
                f"Model: \t\t {name}\nIRQ:   \t\t {300 + i}\nGPU UUID: \t GPU-{i:08x}-h100\n"
                f"Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                f"Bus Location: \t {address}\nDevice Minor: \t {i}\nGPU Excluded:\t No\n")
    for bus, node in NVSWITCHES:
        pci_function(root, f"0000:{bus}:00.0", vendor=0x10DE, device=0x22A3, pci_class=0x068000,
                     numa=node, cpus=NODE_CPUS[node], links=links)
    pci_function(root, "0000:1a:00.0", vendor=0x15B3, device=0x1021, pci_class=0x020700, numa=0,
                 cpus=NODE_CPUS[0], links=links)
    pci_function(root, "0000:00:00.0", vendor=0x8086, device=0x09A2, pci_class=0x060000, numa=0,
                 cpus=NODE_CPUS[0], links=links)
    # An NVIDIA audio function (class 0x0403) on a consumer board: not a GPU.
    pci_function(root, "0000:18:00.1", vendor=0x10DE, device=0x22BA, pci_class=0x040300, numa=0,
                 cpus=NODE_CPUS[0], links=links)
    return root
