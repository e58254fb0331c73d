"""The contract both halves read: what the node agent writes and the admission controller reads.

`names` (`topolet.io/` names), `placements` (zone and placements formats), `nrt` (the NRT's group,
version, kind, zone type, attributes, legacy policy names), `fingerprint`, `resources` (names,
quantities), `policies` (NUMA policy and Topology Manager names), `qos`, `podplan` (a pod's pinning
decision), `podrequests` (requests as the scheduler counts them), `objects` (API object readers),
`validate` (name and label syntax).  Pure, no I/O; imports only `agent.errors` (and `xxhash`).
"""
