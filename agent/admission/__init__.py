"""The gang admission controller (`topolet controller`), in rooms that import downwards only.

engine (pure placement) → gangs (API objects ↔ engine values) → report (metrics, Events) → cluster
(the picture across passes) → jobs | kueue (the two routes, side by side) → controller (the loop).
Each room's `__init__` says what it holds and what it may import; nothing is re-exported.
"""
