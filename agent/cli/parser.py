"""The `topolet` command line: every subcommand's options, checked as argparse reads them.

`build_parser()` imports argparse only when called: a plainly spelled `discover` never calls it
(`agent.cli.plain_discover_args`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable
    from typing import Any, NoReturn

DISCOVER_FORMATS = ("table", "json", "yaml", "labels", "conformance", "svg", "png")
KUBECONFIG_HELP = ("kubeconfig file (default: $KUBECONFIG, whose files joined by ':' merge, else the pod's "
                   "in-cluster service account, else ~/.kube/config)")


def _version() -> str:
    """The installed distribution's version ("unknown" when run from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("topolet")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    import argparse
    import sys

    import agent.cli.commands as commands  # `from agent.cli import` would also name this package
    import agent.cli.values as values
    from agent.api.policies import ALLOC_NUMA_POLICIES, TOPOLOGY_MANAGER_SCOPES, NumaPolicy, Scope
    from agent.cli.logging_setup import LOG_LEVELS

    def log_level(parser: argparse.ArgumentParser, default: str | None = None) -> None:
        parser.add_argument("--log-level", default=default, choices=LOG_LEVELS,
                            help=f"log messages of this level and above (default {default or 'warning'})")

    class Parser(argparse.ArgumentParser):
        """argparse's parser, saying a bad command line in one line (the usage is a --help away).

        Options are never abbreviated (`--cpu` is not taken for `--cpus`), and a subcommand names
        the options it does not know, with the nearest it does.  Every subcommand's parser is one of
        these too (`add_subparsers` makes its parent's class).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("allow_abbrev", False)
            super().__init__(*args, **kwargs)
            self.words: list[str] = []

        def parse_known_args(self, args: Iterable[str] | None = None,
                             namespace: Any = None) -> tuple[Any, list[str]]:
            self.words = list(sys.argv[1:] if args is None else args)
            parsed, extras = super().parse_known_args(self.words, namespace)
            misspelt = self.misspelt() if extras else ""
            if misspelt:  # else the top parser says "unrecognized arguments", as argparse does
                self.exit(2, self.line(misspelt))
            return parsed, extras

        def misspelt(self) -> str:
            """The words that look like an option of this subcommand and are none, each with the
            nearest that is, as argparse's "unrecognized arguments: ..."; "" when there are none."""
            if self._subparsers is not None:
                return ""  # the words are a subcommand's: its own parser judges them
            import difflib

            options = self._option_string_actions
            found = []
            words = iter(self.words)
            for word in words:
                if word == "--" or not word.startswith("-"):
                    break  # the command `exec` runs starts here (no other subcommand takes a word)
                name, eq, _ = word.partition("=")
                action = options.get(name)
                if action is None and name.startswith("--"):
                    near = difflib.get_close_matches(name, list(options), n=1)
                    found.append(name + (f" (did you mean {near[0]}?)" if near else ""))
                elif action is not None and action.nargs != 0 and not eq:
                    next(words, None)  # its value, whatever it looks like
            return f"unrecognized arguments: {', '.join(found)}" if found else ""

        def line(self, message: str) -> str:
            return f"{self.prog}: error: {message} (see {self.prog} --help)\n"

        def error(self, message: str) -> NoReturn:
            # A misspelt option also leaves a required one missing: name the word first.
            misspelt = self.misspelt()
            self.exit(2, self.line(f"{misspelt}; {message}" if misspelt else message))

    p = Parser(prog="topolet", description="Node topology agent.")
    p.add_argument("--version", action="version", version=f"topolet {_version()}",
                   help="print topolet's version and exit")
    # Naming `prog` spares argparse its usage formatter at start-up (it imports shutil, bz2, lzma).
    sub = p.add_subparsers(dest="command", required=True, prog="topolet")

    d = sub.add_parser("discover", help="discover this machine's (or a dump's) topology")
    d.add_argument("--fsroot", default="/", help="file-system root to read (a sysfs dump), default /")
    d.add_argument("--format", default="table", choices=DISCOVER_FORMATS,
                   help="table (default), json or yaml (the model; json feeds `alloc --topology`), labels "
                        "(the node labels), conformance (what the hwloc conformance grader compares), svg or "
                        "png (a picture of the machine, as lstopo draws it)")
    d.add_argument("--output", default=None, help="with --format svg or png: write the picture to this file")
    d.add_argument("--gfd-compat", action="store_true",
                   help="also print GPU Feature Discovery's nvidia.com/* labels")
    log_level(d)
    d.set_defaults(handler=commands.discover)

    a = sub.add_parser("alloc", help="run the CPU allocator over a file of requests")
    a.add_argument("--topology", required=True,
                   help="`discover --format json` output, or a kubelet-table topology file (at most 16 MiB)")
    a.add_argument("--requests", required=True,
                   help="file of JSON lines, - for stdin: {free, cpus, numa_policy, smt, reserved, "
                        "preferred_numa}; one answer line each, {cpus} or {error}; lines up to 256 KiB")
    a.add_argument("--name", help="topology name inside a kubelet-table file with several")
    log_level(a)
    a.set_defaults(handler=commands.alloc)

    m = sub.add_parser("mig", help="MIG partition planning")
    msub = m.add_subparsers(dest="mig_command", required=True, prog="topolet mig")
    mp = msub.add_parser("plan", help="plan GPU instances for a demand")
    mp.add_argument("--gpu-model", required=True,
                    help="GPU model, e.g. H100-80GB, or an NVML product name (NVIDIA H100 80GB HBM3)")
    mp.add_argument("--demand", required=True,
                    help="profile=count,... e.g. 3g.40gb=1,2g.20gb=2, or a named layout per GPU "
                         "(all-balanced, all-1g.10gb, ...)")
    mp.add_argument("--gpus", type=int, default=1,
                    help="fresh GPUs of the model to plan for, 1 to 32 (the NVIDIA driver's limit per "
                         "node); default 1")
    mp.add_argument("--format", default="json", choices=["json", "table"],
                    help="json (default, {gpus: [...]} or {error}) or table (one line per GPU)")
    log_level(mp)
    mp.set_defaults(handler=commands.mig)

    g = sub.add_parser("agent", help="run the node agent (standalone without a cluster)")
    g.add_argument("--fsroot", default="/",
                   help="file-system root to discover the hardware from (a sysfs dump), default /")
    g.add_argument("--state-dir", default="/var/lib/topolet",
                   help="folder of the allocation state file (state.json) and its lock, default "
                        "/var/lib/topolet")
    g.add_argument("--features-dir", default="/etc/kubernetes/node-feature-discovery/features.d",
                   help="NFD features.d folder the label file is written to (the file label sink)")
    g.add_argument("--listen", default="127.0.0.1:9470", type=values.listen_address,
                   help="host:port for /metrics and /healthz, default 127.0.0.1:9470 (port 0: any free)")
    g.add_argument("--reserved-cpus", default=None,
                   help="cpulist never handed out as exclusive CPUs (left to the system and shared work); "
                        "'' for none. Default: 0 in standalone mode, none in Kubernetes mode (give the "
                        "kubelet's reservedSystemCPUs)")
    g.add_argument("--reconcile-seconds", type=values.seconds, default=5.0,
                   help="seconds between reconcile passes (release, drift repair), default 5")
    g.add_argument("--cgroup-root", default=None, help="cgroup mount to use (auto-detected)")
    g.add_argument("--once", action="store_true", help="reconcile once and exit")
    g.add_argument("--mode", default="auto", choices=["auto", "standalone", "kubernetes"],
                   help="auto (default): Kubernetes in a pod, given --kubeconfig or with $KUBECONFIG set, "
                        "else standalone; the agent logs which it picked and why")
    g.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
    g.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME)")
    g.add_argument("--label-sink", default="auto", choices=["auto", "nodefeature", "node", "file", "none"],
                   help="auto (default): a NodeFeature where an nfd-master labels this node (its Node "
                        "carries nfd.node.kubernetes.io/feature-labels and the API serves NodeFeature), "
                        "else a patch of the Node's own labels; looked at again every minute. Without a "
                        "cluster, the features.d file")
    g.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's pod-resources gRPC socket (Kubernetes mode: devices per container)")
    g.add_argument("--gfd-compat", action="store_true", help="also publish GFD's nvidia.com/* labels")
    g.add_argument("--mig-config", default="",
                   help="named MIG layout to keep applied (standalone; in Kubernetes the node label "
                        "topolet.io/mig.config overrides it)")
    g.add_argument("--allow-mig-mode-change", action="store_true",
                   help="let the agent switch MIG mode on GPUs that run no processes")
    g.add_argument("--route", default="auto", choices=["auto", "nri", "pod-cgroup"],
                   help="Kubernetes mode: how containers are pinned from their first instruction. nri: as "
                        "an NRI plugin answering the runtime's CreateContainer; pod-cgroup: by the pod "
                        "watch; auto (default): nri when --nri-socket exists and registration answers, "
                        "else pod-cgroup")
    g.add_argument("--nri-socket", default="/var/run/nri/nri.sock",
                   help="the runtime's NRI socket (Kubernetes mode, --route nri|auto), default "
                        "/var/run/nri/nri.sock")
    g.add_argument("--runtime-bundles", default="/run/containerd/io.containerd.runtime.v2.task/k8s.io",
                   help="containerd's OCI bundles of the kubelet's containers (--route pod-cgroup: a pod "
                        "whose containers differ gets each container's CPUs as runc makes its cgroup); "
                        "'' = off, default /run/containerd/io.containerd.runtime.v2.task/k8s.io")
    g.add_argument("--numa-scope", default=Scope.CONTAINER.value, choices=TOPOLOGY_MANAGER_SCOPES,
                   help="Kubernetes mode: the kubelet's topologyManagerScope topolet aligns by. container "
                        "(default, the kubelet's): each container on its own; pod: every container within "
                        "the NUMA nodes chosen for the whole pod. Published as the NRT's "
                        "topologyManagerScope, which the admission controller places by")
    g.add_argument("--enforcement", default="on", choices=["on", "off"],
                   help="Kubernetes mode: off = decide, record in the state file and publish labels and "
                        "NRT as with on, but write no cgroup and need no cpuset hierarchy; a container "
                        "counts as started once its pod status lists it running with a container ID")
    log_level(g, "info")
    g.set_defaults(handler=commands.agent)

    e = sub.add_parser("exec", help="run a command on exclusive, topology-aligned CPUs")
    e.add_argument("--cpus", type=int, required=True,
                   help="exclusive CPUs for the command; 0 runs it on the shared pool")
    e.add_argument("--numa-policy", default=NumaPolicy.BEST_EFFORT.value, choices=ALLOC_NUMA_POLICIES,
                   help="single-numa-node: one NUMA node or a refusal; restricted: the fewest nodes that "
                        "hold it now, refused when an idle machine would need fewer; best-effort (default): "
                        "the fewest nodes that hold it now; spread: even shares over the fewest nodes")
    e.add_argument("--smt", default="any", choices=["full-cores", "any"],
                   help="full-cores: never split a core (a multiple of the threads per core); any "
                        "(default): single threads too")
    e.add_argument("--memory-binding", action="store_true",
                   help="also bind the command's memory to its CPUs' NUMA nodes (cpuset.mems, mempolicy)")
    e.add_argument("--gpus", type=int, default=0,
                   help="whole NVIDIA GPUs to hold with the CPUs, near them (needs --cpus 1 or more)")
    e.add_argument("--state-dir", default="/var/lib/topolet",
                   help="folder of the allocation state shared with the agent, default /var/lib/topolet")
    e.add_argument("--reserved-cpus", default=None,
                   help="cpulist never handed out as exclusive CPUs (as the agent's --reserved-cpus), "
                        "recorded for the agent too; '' for none. Default: the reservation the state "
                        "folder records (the agent's), else 0")
    e.add_argument("--cgroup-root", default=None,
                   help="cgroup (cpuset) folder to work under (default: auto-detected)")
    e.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                   help="the command to run, after --")
    log_level(e)
    e.set_defaults(handler=commands.exec_command)

    s = sub.add_parser("status", help="show allocations and free CPUs per NUMA node")
    s.add_argument("--state-dir", default="/var/lib/topolet",
                   help="folder of the allocation state file, default /var/lib/topolet")
    s.add_argument("--cgroup-root", default=None,
                   help="cgroup (cpuset) folder to read (default: auto-detected)")
    s.add_argument("--format", default="table", choices=["table", "json", "svg", "png"],
                   help="table (default), json, or svg or png (the machine, each allocation's CPUs coloured)")
    s.add_argument("--output", default=None, help="with --format svg or png: write the picture to this file")
    s.add_argument("--watch", action="store_true",
                   help="a live view: per NUMA node the CPUs exclusive, shared and reserved and who holds "
                        "them, redrawn until Ctrl-C (frames separated by a form feed when not a terminal)")
    s.add_argument("--interval", type=float, default=2.0,
                   help="seconds between --watch frames, default 2")
    log_level(s)
    s.set_defaults(handler=commands.status)

    u = sub.add_parser("cleanup", help="remove what topolet created (uninstall): this machine's cgroups and "
                                         "state (--local), its API objects (--objects)")
    u.add_argument("--local", action="store_true",
                   help="remove what the agent made on this machine: its cgroup tree (topolet/, tasks moved "
                        "to the hierarchy root first), the state folder's files and the features.d file; "
                        "run it with the agent stopped")
    u.add_argument("--objects", action="store_true",
                   help="delete topolet's NodeResourceTopologies (never another publisher's), NodeFeatures "
                        "and Node labels: this node's (--node-name) or every node's (--all-nodes)")
    u.add_argument("--state-dir", default="/var/lib/topolet",
                   help="--local: the agent's state folder, default /var/lib/topolet")
    u.add_argument("--features-dir", default="/etc/kubernetes/node-feature-discovery/features.d",
                   help="--local: the NFD features.d folder the agent's label file is in")
    u.add_argument("--cgroup-root", default=None,
                   help="--local: the cgroup (cpuset) folder topolet/ lives in (default: auto-detected)")
    u.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
    u.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="--objects: the node whose objects to delete (default: $NODE_NAME)")
    u.add_argument("--all-nodes", action="store_true", help="--objects: every node's objects")
    u.add_argument("--namespace", default=None, type=values.namespace,
                   help="--objects: the agents' namespace, where their NodeFeatures are (default: "
                        "$POD_NAMESPACE, the service account's, else topolet-system)")
    u.add_argument("--daemonset", action="append", default=[], metavar="NAME",
                   help="--objects: first stop the agents' DaemonSet NAME in --namespace (a running agent "
                        "writes its objects again) and run cleanup --local on each of its nodes through a "
                        "DaemonSet NAME-cleanup made from its pod template; repeat per node pool")
    u.add_argument("--timeout-seconds", type=values.seconds, default=300.0,
                   help="--daemonset: the budget of all the waits for pods together; nodes not cleaned by "
                        "then are named, the objects deleted all the same, exit 3 (default 300)")
    log_level(u, "info")
    u.set_defaults(handler=commands.cleanup)

    c = sub.add_parser("controller", help="run the central admission controller (gangs of queued Jobs)")
    c.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
    c.add_argument("--namespace", default=None, type=values.namespace,
                   help="the controller's namespace, for its Lease (default: $POD_NAMESPACE, the service "
                        "account's, else topolet-system)")
    c.add_argument("--listen", default="0.0.0.0:9471", type=values.listen_address,
                   help="host:port for /metrics and /healthz, default 0.0.0.0:9471")
    c.add_argument("--leader-elect", action="store_true",
                   help="elect one deciding replica through the Lease topolet-controller")
    c.add_argument("--lease-duration", type=values.seconds, default=15.0,
                   help="seconds a Lease holder that stopped renewing keeps it (default 15)")
    c.add_argument("--renew-deadline", type=values.seconds, default=10.0,
                   help="seconds the leader keeps deciding without a successful renewal (default 10)")
    c.add_argument("--retry-period", type=values.seconds, default=2.0,
                   help="seconds between leader election attempts (default 2)")
    c.add_argument("--identity", default=None,
                   help="this replica's name in the Lease (default: $POD_NAME, else host-pid)")
    c.add_argument("--queue", action="append", default=[], metavar="NAME=MODE[:NS,...]", type=values.queue,
                   help="a queue Jobs may name in topolet.io/queue: its mode, StrictFIFO (the head blocks "
                        "the rest) or BestEffortFIFO (later gangs may pass a head that does not fit), and "
                        "the namespaces whose Jobs it takes (none listed: every namespace); repeat per "
                        "queue. Jobs naming any other queue are refused. Without --queue: one queue, "
                        "default=BestEffortFIFO, open to every namespace")
    c.add_argument("--resync-seconds", type=values.seconds, default=30.0,
                   help="a decision pass at least this often, changes or not (default 30)")
    c.add_argument("--ledger-timeout-seconds", type=values.seconds, default=120.0,
                   help="seconds a placement counts against capacity while the NRT does not show it "
                        "(default 120)")
    c.add_argument("--kueue", default="auto", choices=["auto", "on", "off"],
                   help="also act as the Kueue AdmissionCheck controller topolet.io/topology-fit: on, off, "
                        "or auto (the default: on when the API serves Kueue's v1beta2 to this controller)")
    c.add_argument("--crash-at", default=None,
                   choices=["after-decision", "after-unsuspend", "after-pod-patch"],
                   # For the restart tests only (SIGKILL this process the first time it reaches the
                   # step): it works, but --help does not offer it.
                   help=argparse.SUPPRESS)
    log_level(c, "info")
    c.set_defaults(handler=commands.controller)
    return p
