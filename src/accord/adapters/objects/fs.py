"""The filesystem object store (``file:///dir``); implemented in :mod:`accord.objects.fs`."""

from accord.objects.fs import FileObjectStore

__all__ = ["FileObjectStore"]
