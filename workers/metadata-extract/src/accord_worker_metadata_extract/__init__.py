"""The ``metadata.extract@2`` reference worker: measures a model's geometry."""

from accord_worker_metadata_extract.handler import CAPABILITY, handle, worker

__all__ = ["CAPABILITY", "handle", "worker"]
