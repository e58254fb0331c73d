"""Prometheus metrics: `registry` (every metric the agent exports) and `server` (/metrics, /healthz)."""
