"""MIG on a Kubernetes node: the `topolet.io/mig.config` label applied and its state reported."""
