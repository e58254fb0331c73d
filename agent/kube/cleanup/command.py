"""`topolet cleanup`: remove what topolet created, for an uninstall.

`--local` removes the node's cgroup tree, state files and features.d file; `--objects` (with
`--daemonset`, the agents' nodes first) the NRTs, NodeFeatures and Node labels topolet wrote.
`--timeout-seconds` bounds the whole command.  Exit status 0 done, 2 error, 3 (`PARTIAL`) objects
deleted but some node not done in time (README.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from agent.errors import ConfigError, EnforcementError

PARTIAL = 3  # exit status: the API objects deleted, some node left (named on stderr)


def _local(args: argparse.Namespace) -> str:
    from agent.enforce.cgroup import detect_layout
    from agent.enforce.cleanup import remove_cgroup_tree, remove_state_files
    from agent.labels.features_file import remove_features_file

    try:
        layout = detect_layout(args.cgroup_root)
    except EnforcementError:
        if args.cgroup_root is not None:
            raise
        layout = None  # no cpuset hierarchy here: the agent made no cgroup on this machine
    if layout is None:
        cgroups = "no cpuset hierarchy, no cgroups"
    else:
        done = remove_cgroup_tree(layout)
        where = layout.abspath(done.to)
        cgroups = (f"{len(done.removed)} cgroup(s) removed from {layout.abspath(layout.parent)}, "
                   f"{done.moved} task(s) moved to {where}")
    files = remove_state_files(args.state_dir)
    label_file = remove_features_file(args.features_dir) if os.path.isdir(args.features_dir) else False
    return (f"local: {cgroups}; {len(files)} state path(s) removed from {args.state_dir}; "
            f"features.d file {'removed' if label_file else 'absent'}")


def _objects(args: argparse.Namespace) -> tuple[str, list[str]]:
    """Clean the nodes, then delete the objects: the summary line, and what was left undone."""
    from agent.kube.cleanup.nodes import clean_nodes, split_budget
    from agent.kube.cleanup.sweep import delete_objects
    from agent.kubeapi.client import KubeClient, agent_namespace, load_api_client, node_name

    steps = split_budget(time.monotonic(), args.timeout_seconds)
    node = None if args.all_nodes else node_name(args.node_name)
    namespace = agent_namespace(args.namespace)
    kube = KubeClient(load_api_client(args.kubeconfig))
    try:
        nodes = clean_nodes(kube, namespace, args.daemonset, steps)
        done = delete_objects(kube, namespace, node)
    finally:
        kube.close()
    scope = "every node" if node is None else f"node {node}"
    stopped = "".join(part + "; " for part in nodes.done)
    left = f"; left to their managers: {', '.join(done.left)}" if done.left else ""
    return (f"objects ({scope}): {stopped}{len(done.nrts)} NodeResourceTopology(ies), "
            f"{len(done.nodefeatures)} NodeFeature(s) in {namespace} deleted, topolet labels removed "
            f"from {len(done.node_labels)} Node(s){left}"), nodes.left


def run_cleanup(args: argparse.Namespace) -> int:
    """Entry point of `topolet cleanup`."""
    if not (args.local or args.objects):
        raise ConfigError("say what to remove: --local (this machine), --objects (the API), or both")
    if args.daemonset and not args.objects:
        raise ConfigError("--daemonset goes with --objects")
    left: list[str] = []
    if args.objects:
        summary, left = _objects(args)
        print(f"topolet cleanup: {summary}", flush=True)
    if args.local:
        print(f"topolet cleanup: {_local(args)}", flush=True)
    if left:
        print(f"topolet cleanup: not done within {args.timeout_seconds:g} s, the objects deleted all the "
              f"same: {'; '.join(left)} (what to do: \"Uninstall\" in charts/topolet/README.md)",
              file=sys.stderr, flush=True)
        return PARTIAL
    return 0
