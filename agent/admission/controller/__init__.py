"""The top: the decision loop (`loop`), its write path (`writes`) and the sub-command (`command`).

May import every room of `agent.admission` below it, `agent.kube`, `agent.metrics` and `agent.errors`.
"""
