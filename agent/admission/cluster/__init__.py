"""The controller's picture of the cluster across passes (Kueue's pkg/cache): stores, index, view, ledger.

Holds `store` (Reflector, VersionCache), `heap` (its garbage-collection policy), `podindex`, `view`,
`ledger` and `capacity` (ledger and view across passes).  May import `agent.admission.engine`,
`agent.admission.gangs`, `agent.admission.report`, `agent.kube` (client, nrt, pods) and `agent.errors`.
"""
