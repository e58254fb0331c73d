"""The Job route, pure: each queued Job version read once (`jobread`), queue order (`queues`), and the
Job and pod patch bodies (`patches`) the controller's write path sends.

May import `agent.admission.engine`, `gangs`, `cluster` and `report`, and `agent.errors`; never
`agent.admission.kueue` or `agent.admission.controller`.
"""
