"""gpu-scheduler: GPU-aware scheduling for Kubernetes (shared contract, CLI, serving)."""

__version__ = "0.2.0"
