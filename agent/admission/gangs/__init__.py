"""API objects as engine values and back, shared by both routes and the cluster picture (pure).

Holds the tolerant object readers (`objects`), Job and pod template → Gang (`job`), the admission record
and placements format (`record`) and which pod holds which slot (`slots`).  May import
`agent.admission.engine`, `agent.errors`, `agent.kube.pods` and `agent.labels.validate`.
"""
