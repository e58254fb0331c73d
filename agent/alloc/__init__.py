"""The node side's allocator: exclusive, topology-aligned CPUs and whole GPUs for one request.

Entry points: `exclusive.allocate` (CPUs), `devices.choose_gpus` / `allocate_with_gpus` (GPUs beside
them), `scope.within` (a container inside its pod's NUMA nodes); NUMA policies are rows of
`policies.ALLOC_POLICIES`.  Pure but for `command` and `topology_file`.  Module list, GPU choice and
the Topology Manager scope: agent/alloc/README.md.
"""
