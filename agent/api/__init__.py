"""The contract both halves read: what the node agent writes and the admission controller reads, and
the other way round, in one place below both.

`names` (the `topolet.io/` annotation and label names), `placements` (the zone and placements
formats, the completion index), `nrt` (the NodeResourceTopology group, version, kind, zone type,
attributes and legacy policy names), `fingerprint` (the pod set fingerprint), `resources` (resource
names, quantity parse and format), `policies` (NUMA policy and Topology Manager names), `qos` (a
pod's QoS class), `podplan` (a pod's pinning decision, which the controller's ledger reads as the
agent does), `podrequests` (a pod's requests as the scheduler counts them), `objects` (tolerant and
strict readers of API objects), `validate` (Kubernetes name and label syntax).
Pure, no I/O; imports only `agent.errors` (and `xxhash`).
"""
