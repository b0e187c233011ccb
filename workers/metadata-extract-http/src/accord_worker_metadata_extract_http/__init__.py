"""``metadata.extract@2`` behind HTTP: the reference remote worker (docs/remote-workers.md)."""

from accord_worker_metadata_extract_http.app import RemoteWorker, Settings
from accord_worker_metadata_extract_http.server import LoopbackServer

__all__ = ["LoopbackServer", "RemoteWorker", "Settings"]
