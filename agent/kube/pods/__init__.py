"""Pods on this node: the pod watch, the pinner, and the two pinning routes (NRI, pod cgroups)."""
