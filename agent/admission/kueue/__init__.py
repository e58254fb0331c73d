"""The Kueue route: the `topolet.io/topology-fit` AdmissionCheck, decided inside the controller's pass.

Holds `workloads` (pure: Workload → gang, the check's state bodies), `holds` (Ready Workloads' ledger
entries and pod slots), `writes` (the check's writes off the pass) and `check` (its stores and its part
of a pass).  May import `agent.admission.engine`, `gangs`, `cluster` and `report`, `agent.kube` and
`agent.errors`; never `agent.admission.jobs` or `agent.admission.controller`.
"""
