"""The ``thumbnail.render@3`` reference worker: headless shaded previews of a model."""

from accord_worker_thumbnail_render.handler import CAPABILITY, handle, worker

__all__ = ["CAPABILITY", "handle", "worker"]
