"""The placement engine: `place.place(view, gang)` and `place.commit`, pure functions on plain values.

Holds the values (`model`), the NUMA policy table (`policies`), the gang search and its parts, and the
shared-GPU score.  Imports nothing from `agent` outside itself but the contract's names
(`agent.api.policies`): no I/O, no clock, no API objects.  Module list, placement rules, scoring and
the fragmentation measure: agent/admission/engine/README.md.
"""
