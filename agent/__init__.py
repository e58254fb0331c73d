"""topolet: a per-node topology agent for batch, HPC and AI clusters."""

__version__ = "0.1.0"
