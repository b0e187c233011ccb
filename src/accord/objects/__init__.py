"""Object storage: the :class:`~accord.objects.ports.ObjectStore` port and what travels across it.

Adapters (filesystem, S3) live in :mod:`accord.adapters.objects`; the worker resolves a payload's
``storageConnectionRef`` into a tenant-scoped store (:mod:`accord.worker.storage`) and the
stage-result cache keeps its entries in one (:mod:`accord.actions.cache`). See docs/objects.md.
"""

from accord.objects.ports import (
    ObjectDenied,
    ObjectError,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectUnavailable,
    StoredObject,
)

__all__ = [
    "ObjectDenied",
    "ObjectError",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectUnavailable",
    "StoredObject",
]
