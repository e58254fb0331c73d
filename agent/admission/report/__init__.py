"""What the controller tells operators: its Prometheus metrics (`metrics`) and Events (`events`).

May import `agent.admission.engine`, `agent.admission.gangs`, `agent.kubeapi.client`, `agent.metrics` and
`agent.errors`.
"""
