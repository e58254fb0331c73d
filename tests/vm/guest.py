"""A throwaway qemu guest on cgroup v2 that runs a pytest selection of this repository.

    run = run_in_guest(["tests/enforce", "-q"])   # boots, runs pytest with CI=true, powers off
    run.rc, run.output, run.junit, run.cgroup_fs, run.console, run.summary()
    python -m tests.vm.guest tests/enforce/test_cgroup_v2.py -q       # the same from a shell

The guest (`tests/vm/build.sh`: Debian bookworm's kernel, a minbase root file system as its initramfs,
`tests/vm/init.sh` as PID 1) mounts cgroup2 alone at /sys/fs/cgroup; its root file system lives in
RAM and is gone at power-off.  It sees, read-only and at the same paths as here, this repository
with its .venv and the .venv's base interpreter, so it imports exactly the code and packages under
test (a .venv built on Debian's /usr/bin/python3 uses the guest's own python3.11), plus any
`extra_shares`.  A job folder on the host is shared read-write: pytest's output, its JUnit XML and
the serial console land there.  KVM when the CPU has vmx/svm, TCG emulation otherwise (slower,
never skipped).  qemu is killed when the run ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.controlplane.harness import _die_with_parent

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
BUILD_TIMEOUT_S = 1800.0  # a cold debootstrap
RUN_TIMEOUT_S = 900.0
QEMU = "qemu-system-x86_64"
# Characters the kernel command line (spaces), init.sh's share syntax (":") and qemu's option
# parser (",") would split on.
_UNSAFE_PATH_CHARS = frozenset(" \t\n:,=\"'\\")


class GuestError(Exception):
    """The guest could not be built or booted, or ended without finishing its job."""


@dataclass(frozen=True, slots=True)
class GuestImage:
    """The guest's kernel and its initramfs (the whole root file system)."""

    kernel: Path
    initrd: Path


@dataclass(frozen=True, slots=True)
class Share:
    """A host folder the guest mounts over 9p at the same path."""

    tag: str
    path: Path
    writable: bool = False


@dataclass(frozen=True, slots=True)
class GuestRun:
    """What one guest run left: pytest's exit status and output, and where the time went."""

    rc: int
    output: str
    junit: Path
    cgroup_fs: str  # `stat -f` type of the guest's /sys/fs/cgroup ("cgroup2fs" on v2)
    console: str
    accel: str  # "kvm" or "tcg"
    boot_s: float  # host wall time, qemu started -> job started in the guest
    tests_s: float  # guest time the job (pytest) ran
    wall_s: float  # host wall time of the whole run, qemu start to exit

    def summary(self) -> str:
        """One line of figures: accelerator, boot, test and wall time, cgroup file system, pytest's rc."""
        return (f"guest ({self.accel}): boot {self.boot_s:.1f} s | tests {self.tests_s:.1f} s | "
                f"wall {self.wall_s:.1f} s | /sys/fs/cgroup {self.cgroup_fs} | pytest rc {self.rc}")


def build_guest(timeout_s: float = BUILD_TIMEOUT_S) -> GuestImage:
    """Build (or find in the cache) the guest through build.sh."""
    try:
        done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise GuestError(f"build.sh took longer than {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise GuestError(f"build.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if "kernel" not in paths or "initrd" not in paths:
        raise GuestError(f"build.sh printed no kernel/initrd: {done.stdout!r}")
    return GuestImage(Path(paths["kernel"]), Path(paths["initrd"]))


def kvm_usable(device: str = "/dev/kvm", cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether qemu can boot a stock kernel under KVM here (else it must emulate).

    The device alone is not enough: without the CPU's virtualisation extensions (vmx/svm) a
    /dev/kvm can only be a software one such as PVM, which boots only kernels built as its guests
    (a Debian kernel hangs before its first message).
    """
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "vmx" in flags or "svm" in flags


def python_shares(executable: str = sys.executable, base_prefix: str = sys.base_prefix,
                  prefix: str = sys.prefix, repo: Path = REPO) -> list[Share]:
    """The shares that let the guest run `executable` as here: the repo, the venv and its interpreter.

    An interpreter under /usr is Debian's own, which the guest has too: sharing it would hide the
    guest's /usr.
    """
    shares = [Share("repo", repo)]
    venv = Path(prefix)
    if venv.resolve() != Path(base_prefix).resolve() and not venv.resolve().is_relative_to(repo.resolve()):
        shares.append(Share("venv", venv))
    base = Path(base_prefix).resolve()
    if base != Path("/usr") and not base.is_relative_to(repo.resolve()):
        shares.append(Share("python", base))
    return shares


def numa_argv(cpus: int, memory_mib: int, nodes: int) -> list[str]:
    """qemu options splitting `cpus` and `memory_mib` evenly over `nodes` NUMA nodes, in order (node 0
    the first CPUs); none for `nodes` 0.  Each node's memory is a RAM backend of its own."""
    if nodes == 0:
        return []
    if nodes < 0 or cpus % nodes or memory_mib % nodes:
        raise GuestError(f"cannot split {cpus} CPUs and {memory_mib} MiB evenly over {nodes} NUMA nodes")
    per_cpus, per_mib = cpus // nodes, memory_mib // nodes
    argv: list[str] = []
    for n in range(nodes):
        first = n * per_cpus
        argv += ["-object", f"memory-backend-ram,id=numa{n},size={per_mib}M",
                 "-numa", f"node,nodeid={n},cpus={first}-{first + per_cpus - 1},memdev=numa{n}"]
    return argv


def qemu_argv(image: GuestImage, shares: Sequence[Share], job: Path, *, cpus: int, memory_mib: int,
              kvm: bool, net: bool = False, numa_nodes: int = 0) -> list[str]:
    """The qemu command line of one run; `job` must also be one of `shares` (writable).

    `net` gives the guest qemu's user network (no privileges, nothing on the host to clean up): the
    guest is 10.0.2.15 and reaches the host's loopback as 10.0.2.2.  `numa_nodes` > 0 spreads the CPUs
    and memory over that many emulated NUMA nodes (numa_argv); 0 leaves the machine as qemu makes it
    (one node).
    """
    if len({s.tag for s in shares}) != len(shares):
        raise GuestError(f"share tags are not unique: {[s.tag for s in shares]}")
    for share in shares:
        if set(str(share.path)) & _UNSAFE_PATH_CHARS or not share.path.is_absolute():
            raise GuestError(f"cannot share {share.path!r} with the guest: needs an absolute path "
                             "without spaces, ':', ',', '=' or quotes")
    cmdline = [
        "console=ttyS0", "loglevel=4", "panic=-1",
        # The init mounts cgroup2 itself; these keep the v1 controllers out of reach even so.
        "cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1",
        *(f"topolet.share={s.tag}:{s.path}:{'rw' if s.writable else 'ro'}" for s in shares),
        f"topolet.job={job}",
        *(["topolet.net=user"] if net else []),
    ]
    argv = [
        QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        *(["-accel", "kvm", "-cpu", "host"] if kvm else ["-accel", "tcg,thread=multi", "-cpu", "max"]),
        "-smp", str(cpus), "-m", str(memory_mib), *numa_argv(cpus, memory_mib, numa_nodes),
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", " ".join(cmdline),
        "-serial", f"file:{job / 'console.log'}",
    ]
    if net:
        # No option ROM: the guest boots its kernel directly, and -nodefaults leaves none to find.
        argv += ["-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0,romfile="]
    for s in shares:
        opts = f"local,path={s.path},mount_tag={s.tag},security_model=none"
        argv += ["-virtfs", opts if s.writable else opts + ",readonly=on"]
    return argv


def job_script(pytest_args: Sequence[str], job: Path, *, python: str = sys.executable,
               repo: Path = REPO, env: Mapping[str, str] | None = None) -> str:
    """The shell script the guest's init runs: record the cgroup file system, then run pytest."""
    environment = {
        "CI": "true",
        "HOME": "/root",
        # Tests that reshape the whole machine's cgroups run only where it is thrown away after.
        "TOPOLET_GUEST": "1",
        # The repository is read-only in the guest: no bytecode, caches or example database there.
        "PYTHONDONTWRITEBYTECODE": "1",
        "HYPOTHESIS_STORAGE_DIRECTORY": "/tmp/hypothesis",
        **(env or {}),
    }
    pytest = [python, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs",
              f"--junitxml={job / 'junit.xml'}", *pytest_args]
    return "\n".join([
        f"cd {shlex.quote(str(repo))} || exit 125",
        f"stat -fc %T /sys/fs/cgroup >{shlex.quote(str(job / 'cgroup-fs'))}",
        "exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in environment.items()) + " "
        + " ".join(shlex.quote(a) for a in pytest),
        "",
    ])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def run_in_guest(
    pytest_args: Sequence[str],
    *,
    job_dir: Path | None = None,
    cpus: int = 4,
    memory_mib: int = 2048,
    timeout_s: float = RUN_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    image: GuestImage | None = None,
    extra_shares: Sequence[Share] = (),
    net: bool = False,
    numa_nodes: int = 0,
) -> GuestRun:
    """Boot the guest, run pytest on `pytest_args` there (CI=true, from the repository root), power off.

    `extra_shares` adds host folders at the same paths (built binaries, caches: read-only unless
    marked writable); `net` a network to the host, `numa_nodes` emulated NUMA nodes (see qemu_argv).
    Raises GuestError when the guest cannot be built, does not finish within `timeout_s`, or ends
    without a pytest exit status; its message carries the console's tail.
    """
    image = image or build_guest()
    job = Path(tempfile.mkdtemp(prefix="topolet-vm-")) if job_dir is None else job_dir
    job.mkdir(parents=True, exist_ok=True)
    (job / "run.sh").write_text(job_script(pytest_args, job, env=env))
    kvm = kvm_usable()
    shares = [*python_shares(), *extra_shares, Share("job", job, writable=True)]
    argv = qemu_argv(image, shares, job, cpus=cpus, memory_mib=memory_mib, kvm=kvm, net=net,
                     numa_nodes=numa_nodes)

    start = time.monotonic()
    boot_s: float | None = None
    with open(job / "qemu.log", "wb") as qemu_log:
        qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
    try:
        while qemu.poll() is None:
            if boot_s is None and (job / "started").exists():
                boot_s = time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise GuestError(f"the guest ran longer than {timeout_s:.0f} s; console:\n"
                                 f"{_read(job / 'console.log')[-3000:]}\noutput:\n"
                                 f"{_read(job / 'output.log')[-3000:]}")
            time.sleep(0.05)
    finally:
        if qemu.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(qemu.pid, 9)
        qemu.wait()
    wall_s = time.monotonic() - start

    console = _read(job / "console.log")
    rc_text = _read(job / "rc").strip()
    if not rc_text:
        raise GuestError(f"the guest ended (qemu exit {qemu.returncode}) without a pytest exit status;\n"
                         f"qemu: {_read(job / 'qemu.log')[-2000:]}\nconsole:\n{console[-4000:]}\n"
                         f"output:\n{_read(job / 'output.log')[-3000:]}")
    started = float(_read(job / "started") or 0)
    finished = float(_read(job / "finished") or started)
    return GuestRun(
        rc=int(rc_text),
        output=_read(job / "output.log"),
        junit=job / "junit.xml",
        cgroup_fs=_read(job / "cgroup-fs").strip(),
        console=console,
        accel="kvm" if kvm else "tcg",
        boot_s=boot_s if boot_s is not None else wall_s,
        tests_s=finished - started,
        wall_s=wall_s,
    )


def main(argv: Sequence[str]) -> int:
    """`python -m tests.vm.guest [PYTEST ARGS...]`: run a selection in the guest, print its output."""
    run = run_in_guest(list(argv) or ["tests/enforce"])
    print(run.output, end="")
    print(run.summary())
    print(f"logs, JUnit XML and console: {run.junit.parent}")
    return run.rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
