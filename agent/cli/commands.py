"""What each `topolet` subcommand runs: each loads its module only when it runs."""

from __future__ import annotations

import os

from agent.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and argparse cost start-up time, and `discover` is timed as a whole process
    import argparse


def register_label_sources() -> None:
    """Register the label sources that live outside `agent.labels` (each registers itself on import):
    the GPU source.  The labels the agent publishes and `discover --format labels` prints are the same."""
    import agent.gpu.labels  # noqa: F401


def discover(args: argparse.Namespace) -> int:
    if args.format in ("svg", "png") or args.output:
        from agent.render.command import run_discover_picture

        return run_discover_picture(args)
    if args.format == "labels":
        from agent.labels.command import run_discover_labels

        register_label_sources()
        return run_discover_labels(args)
    from agent.topology.report import run_discover

    return run_discover(args)


def alloc(args: argparse.Namespace) -> int:
    from agent.alloc.command import run_alloc

    return run_alloc(args)


def mig(args: argparse.Namespace) -> int:
    from agent.gpu.command import run_mig

    return run_mig(args)


def agent(args: argparse.Namespace) -> int:
    import logging

    from agent.cli.mode import KUBERNETES, agent_mode

    mode, why = agent_mode(args.mode, args.kubeconfig, os.environ)
    logging.getLogger("topolet.agent").info("%s mode: %s", mode, why)
    register_label_sources()
    if mode == KUBERNETES:
        from agent.cli.compose import agent_config, kube_agent
        from agent.kube.daemon import run_kube_agent
        from agent.metrics.registry import Metrics

        return run_kube_agent(kube_agent(agent_config(args), Metrics()))
    if args.enforcement == "off":
        # Standalone pinning is the agent's whole job there; a dry run of it is `topolet alloc`.
        raise ConfigError("--enforcement off is for the Kubernetes mode only")
    from agent.cli.compose import standalone_config
    from agent.standalone.daemon import run_agent

    return run_agent(standalone_config(args))


def exec_command(args: argparse.Namespace) -> int:
    from agent.standalone.launch import run_exec

    return run_exec(args)


def status(args: argparse.Namespace) -> int:
    if args.watch or args.format in ("svg", "png") or args.output:
        from agent.render.command import run_status_view

        return run_status_view(args)
    from agent.standalone.launch import run_status

    return run_status(args)


def controller(args: argparse.Namespace) -> int:
    from agent.admission.controller.command import run_controller

    return run_controller(args)


def cleanup(args: argparse.Namespace) -> int:
    from agent.kube.cleanup.command import run_cleanup

    return run_cleanup(args)
