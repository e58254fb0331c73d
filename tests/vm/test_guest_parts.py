"""The guest harness's pure parts: qemu's command line, the job script, the shares, KVM detection."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.vm.guest import GuestError, GuestImage, Share, job_script, kvm_usable, python_shares, qemu_argv

IMAGE = GuestImage(Path("/c/vmlinuz"), Path("/c/initrd.img"))
JOB = Path("/tmp/job")


def _value(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == option]


@pytest.mark.parametrize(
    ("kvm", "accel", "cpu"),
    [(True, "kvm", "host"), (False, "tcg,thread=multi", "max")],
)
def test_qemu_argv(kvm: bool, accel: str, cpu: str) -> None:
    shares = [Share("repo", Path("/work/main")), Share("job", JOB, writable=True)]
    argv = qemu_argv(IMAGE, shares, JOB, cpus=4, memory_mib=2048, kvm=kvm)
    assert (_value(argv, "-accel"), _value(argv, "-cpu")) == ([accel], [cpu])
    assert (_value(argv, "-smp"), _value(argv, "-m")) == (["4"], ["2048"])
    assert (_value(argv, "-kernel"), _value(argv, "-initrd")) == (["/c/vmlinuz"], ["/c/initrd.img"])
    assert "-no-reboot" in argv  # a panic ends qemu instead of looping
    assert _value(argv, "-virtfs") == [
        "local,path=/work/main,mount_tag=repo,security_model=none,readonly=on",
        "local,path=/tmp/job,mount_tag=job,security_model=none",
    ]
    cmdline = _value(argv, "-append")[0].split()
    assert "console=ttyS0" in cmdline and "cgroup_no_v1=all" in cmdline
    assert [a for a in cmdline if a.startswith("topolet.")] == [
        "topolet.share=repo:/work/main:ro", "topolet.share=job:/tmp/job:rw", "topolet.job=/tmp/job",
    ]
    assert _value(argv, "-serial") == ["file:/tmp/job/console.log"]


def test_qemu_argv_with_a_user_network() -> None:
    shares = [Share("job", JOB, writable=True)]
    without = qemu_argv(IMAGE, shares, JOB, cpus=2, memory_mib=512, kvm=False)
    argv = qemu_argv(IMAGE, shares, JOB, cpus=2, memory_mib=512, kvm=False, net=True)
    assert not _value(without, "-netdev") and "topolet.net=user" not in _value(without, "-append")[0]
    assert _value(argv, "-netdev") == ["user,id=net0"]
    assert _value(argv, "-device") == ["virtio-net-pci,netdev=net0,romfile="]
    assert "topolet.net=user" in _value(argv, "-append")[0].split()


@pytest.mark.parametrize("path", ["/a b", "/a:b", "/a,b", "relative", "/a=b"])
def test_paths_the_command_line_cannot_carry_are_refused(path: str) -> None:
    with pytest.raises(GuestError, match="cannot share"):
        qemu_argv(IMAGE, [Share("x", Path(path))], JOB, cpus=2, memory_mib=512, kvm=False)


def test_share_tags_must_be_unique() -> None:
    with pytest.raises(GuestError, match="not unique"):
        qemu_argv(IMAGE, [Share("a", Path("/x")), Share("a", Path("/y"))], JOB, cpus=2, memory_mib=512,
                  kvm=False)


@pytest.mark.parametrize(
    ("executable", "base", "prefix", "tags"),
    [
        # pyenv interpreter, venv in the repository: the interpreter's prefix is shared too
        ("/r/.venv/bin/python", "/root/.pyenv/versions/3.11.7", "/r/.venv", ["repo", "python"]),
        # Debian's python3: the guest has its own /usr, which must not be hidden
        ("/r/.venv/bin/python", "/usr", "/r/.venv", ["repo"]),
        # a venv outside the repository
        ("/v/bin/python", "/usr", "/v", ["repo", "venv"]),
        # no venv at all
        ("/usr/bin/python3", "/usr", "/usr", ["repo"]),
    ],
)
def test_python_shares(executable: str, base: str, prefix: str, tags: list[str]) -> None:
    shares = python_shares(executable, base, prefix, repo=Path("/r"))
    assert [s.tag for s in shares] == tags
    assert not any(s.writable for s in shares)


def test_job_script_runs_pytest_under_ci_from_the_repository() -> None:
    script = job_script(["tests/enforce", "-k", "a b"], JOB, python="/r/.venv/bin/python", repo=Path("/r"),
                        env={"EXTRA": "1"})
    lines = script.splitlines()
    assert lines[0] == "cd /r || exit 125"
    assert lines[1] == "stat -fc %T /sys/fs/cgroup >/tmp/job/cgroup-fs"
    words = shlex.split(lines[2])
    assert words[:2] == ["exec", "env"]
    assert {"CI=true", "TOPOLET_GUEST=1", "PYTHONDONTWRITEBYTECODE=1", "EXTRA=1"} <= set(words)
    at = words.index("/r/.venv/bin/python")
    assert words[at:at + 3] == ["/r/.venv/bin/python", "-m", "pytest"]
    assert "--junitxml=/tmp/job/junit.xml" in words
    assert words[-3:] == ["tests/enforce", "-k", "a b"]


@pytest.mark.parametrize(
    ("flags", "usable"),
    [("fpu vme svm sse", True), ("fpu vmx", True), ("fpu sse avx", False)],
)
def test_kvm_needs_the_device_and_hardware_virtualisation(tmp_path: Path, flags: str, usable: bool) -> None:
    device = tmp_path / "kvm"
    device.write_text("")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert kvm_usable(str(device), str(cpuinfo)) is usable
    assert kvm_usable(str(tmp_path / "missing"), str(cpuinfo)) is False


def test_qemu_argv_with_numa_nodes() -> None:
    shares = [Share("job", JOB, writable=True)]
    assert not _value(qemu_argv(IMAGE, shares, JOB, cpus=4, memory_mib=4096, kvm=False), "-numa")
    argv = qemu_argv(IMAGE, shares, JOB, cpus=4, memory_mib=4096, kvm=False, numa_nodes=2)
    assert _value(argv, "-object") == ["memory-backend-ram,id=numa0,size=2048M",
                                       "memory-backend-ram,id=numa1,size=2048M"]
    assert _value(argv, "-numa") == ["node,nodeid=0,cpus=0-1,memdev=numa0",
                                     "node,nodeid=1,cpus=2-3,memdev=numa1"]
    assert (_value(argv, "-smp"), _value(argv, "-m")) == (["4"], ["4096"])


@pytest.mark.parametrize(("cpus", "memory_mib", "nodes"), [(3, 4096, 2), (4, 4095, 2), (4, 4096, -1)])
def test_numa_nodes_must_split_evenly(cpus: int, memory_mib: int, nodes: int) -> None:
    with pytest.raises(GuestError, match="evenly"):
        qemu_argv(IMAGE, [Share("job", JOB, writable=True)], JOB, cpus=cpus, memory_mib=memory_mib, kvm=False,
                  numa_nodes=nodes)
