"""API objects as engine values and back, shared by both routes and the cluster picture (pure).

Holds Job and pod template → Gang (`job`), the admission record and placements format (`record`) and
which pod holds which slot (`slots`).  May import `agent.admission.engine`, `agent.errors` and the
contract both halves read, `agent.api` (object readers, names, placements, quantities, name syntax).
"""
