"""The ``semantic.analyse@4`` reference worker: explainable shape descriptors and tags."""

from accord_worker_semantic_analyse.handler import CAPABILITY, handle, worker

__all__ = ["CAPABILITY", "handle", "worker"]
