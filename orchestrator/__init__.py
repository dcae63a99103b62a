"""hetspec orchestrator: draft -> verify -> accept across heterogeneous devices."""

__version__ = "0.1.0"
