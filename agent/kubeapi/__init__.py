"""The Kubernetes API plumbing both halves use: below the node agent (`agent.kube`) and the admission
controller (`agent.admission`), above the contract (`agent.api`).

`client` (the one raw-JSON request path, `load_api_client`, `resource_path`), `backoff` (every API
loop's back-off and outage log), `leader` (Lease election, `NotLeader`), `access` (the start-up
check: API server reached, credentials, RBAC), `reflector` (the one list+watch loop both halves
run, `Reflector`).
Imports only `agent.errors` and `agent.api`: never the node's modules, so the controller runs
without them.
"""
