"""Pinning pods on a node: the pod watch, the pinner, and the two routes (NRI, pod cgroups)."""
