"""Which mode `topolet agent` runs in, and why: the line it logs at start."""

from __future__ import annotations

from collections.abc import Mapping

from agent.errors import ConfigError

KUBERNETES = "kubernetes"
STANDALONE = "standalone"


def agent_mode(mode: str, kubeconfig: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """(kubernetes | standalone, why) for `--mode` and `--kubeconfig` in `environ`.

    auto is Kubernetes given --kubeconfig, in a pod ($KUBERNETES_SERVICE_HOST) or with $KUBECONFIG
    set (the client's own conventions), else standalone.
    """
    if mode == STANDALONE:
        if kubeconfig:
            raise ConfigError("--kubeconfig is for the Kubernetes mode, not --mode standalone")
        return STANDALONE, "--mode standalone"
    if mode == KUBERNETES:
        return KUBERNETES, "--mode kubernetes"
    if kubeconfig:
        return KUBERNETES, "--mode auto with --kubeconfig"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return KUBERNETES, "--mode auto in a pod ($KUBERNETES_SERVICE_HOST is set)"
    if environ.get("KUBECONFIG", "").strip():
        return KUBERNETES, "--mode auto with $KUBECONFIG set"
    return STANDALONE, ("--mode auto found no cluster (not in a pod, no --kubeconfig, $KUBECONFIG unset); "
                        "pinning this machine's processes in cpuset cgroups under topolet/ "
                        "(--mode kubernetes to run against a cluster)")
