"""The Worker SDK: bind handlers to capabilities and serve them over any transport.

:class:`Worker` and :class:`Context` are the handler-facing surface (:mod:`accord.worker.sdk`);
:class:`Runtime` is the serving loop (:mod:`accord.worker.runtime`) with the acceptance record
(:mod:`accord.worker.acceptance`) and the wire rules (:mod:`accord.worker.wire`).
"""

from accord.worker.acceptance import AcceptanceLog
from accord.worker.runtime import Runtime
from accord.worker.sdk import Cancelled, Context, RetryableError, TerminalError, Worker
from accord.worker.wire import Announcer, store_announcer

__all__ = [
    "AcceptanceLog",
    "Announcer",
    "Cancelled",
    "Context",
    "RetryableError",
    "Runtime",
    "TerminalError",
    "Worker",
    "store_announcer",
]
