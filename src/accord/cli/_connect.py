"""Reaching a broker at start, and logging a lost one on one line.

A process that serves a queue is no use until its broker answers, and an operator who mistyped a
host wants to hear so, not watch a retry loop. :func:`reach_or_refuse` tries the transport
(:func:`accord.adapters.reach_transport`) until it answers or ``--connect-timeout`` runs out,
logging one line per failed attempt, then refuses on one line naming the transport with its
password masked (exit 1). Once running, a broker that goes away is retried by the loops that use
it; :class:`OneLineFailures` keeps each failure they log to one line (a retryable error is
expected there: its traceback says nothing an operator can act on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from accord.adapters import reach_transport
from accord.cli._common import refuse, usage
from accord.engine.ports import Transport
from accord.engine.runtime.retention import parse_duration
from accord.errors import AccordError

if TYPE_CHECKING:
    from accord.objects.ports import ObjectStore

__all__ = [
    "MASK",
    "OneLineFailures",
    "claim_store",
    "connect_timeout",
    "masked",
    "one_line",
    "reach_or_refuse",
]

log = logging.getLogger("accord.cli")
MASK = "***"
DEFAULT_CONNECT_TIMEOUT = "30s"
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.5, 5.0


def masked(url: str, text: str | None = None) -> str:
    """``text`` (default: ``url`` itself) with the password of ``url`` masked wherever it shows."""
    shown = url if text is None else text
    try:
        password = urlsplit(url).password
    except ValueError:
        return shown
    if not password:
        return shown
    return shown.replace(f":{password}@", f":{MASK}@").replace(password, MASK)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def connect_timeout(text: str) -> float:
    """``--connect-timeout`` in seconds; a bad duration is a usage error (exit 2)."""
    try:
        return parse_duration(text) / 1000
    except ValueError as exc:
        usage(f"--connect-timeout: {exc}")


async def reach_or_refuse(who: str, transport: Transport, url: str, timeout_s: float) -> None:
    """Return once ``transport`` answers; refuse (exit 1) when it has not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause, attempt = _FIRST_PAUSE_S, 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        try:
            await asyncio.wait_for(reach_transport(transport), timeout=max(left, 0.1))
            return
        except (AccordError, OSError, TimeoutError) as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else masked(url, one_line(exc))
        left = deadline - time.monotonic()
        if left <= 0:
            refuse(
                f"{who} not started: transport {masked(url)} not reachable within "
                f"{timeout_s:g}s ({attempt} attempts): {why}"
            )
        log.warning(
            "transport %s not reachable (attempt %d): %s; trying again for %.1fs more",
            masked(url), attempt, why, left,
        )  # fmt: skip
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE_S)


# the broker clients' own loggers: they report a lost connection with its traceback, which the
# client then handles itself (it reconnects); an operator needs the one line
BROKER_LOGGERS = ("aiormq", "aio_pika", "redis", "bullmq")


class OneLineFailures(logging.Filter):
    """Turns a record carrying a retryable error (a transport or store away, retried by the loop
    that logged it) into one line, its error appended; passwords of ``urls`` are masked. On the
    broker clients' loggers (:data:`BROKER_LOGGERS`) every record is made one line."""

    def __init__(self, *urls: str, every: bool = False) -> None:
        super().__init__()
        self._urls = [u for u in urls if u]
        self._every = every

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (self._every or _retryable(exc)):
            text = f"{record.getMessage()}: {one_line(exc)}"
            cause = exc.__cause__ or exc.__context__
            if cause is not None and one_line(cause) not in text:
                text += f" ({one_line(cause)})"
            for url in self._urls:
                text = masked(url, text)
            record.msg, record.args = text, None
            record.exc_info = record.exc_text = None
        return True

    def install(self) -> OneLineFailures:
        """On every handler of the ``accord`` logger (a handler's filters see every record of
        ``accord.*``; a logger's own only those logged on it)."""
        for handler in logging.getLogger("accord").handlers:
            if self not in handler.filters:  # first: the redacting filter sees the new line
                handler.filters.insert(0, self)
        clients = OneLineFailures(*self._urls, every=True)
        for name in BROKER_LOGGERS:
            logger = logging.getLogger(name)
            if not logger.handlers:  # else configured by whoever embeds us: theirs to format
                handler = logging.StreamHandler()  # stderr
                handler.setFormatter(
                    logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
                )
                handler.addFilter(clients)
                logger.addHandler(handler)
                logger.propagate = False
        return self


def _retryable(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False)) or isinstance(exc, ConnectionError | OSError)


def claim_store(url: str | None, default: Path | None) -> ObjectStore | None:
    """``--claims``: the object store large job payloads are checked in to (``accord engine
    run``, ``accord serve``) and out of (``accord worker run``). ``off``: none; no option: the
    folder ``default`` (where the process would share one with the others: the embedded
    default), else none. A URL no adapter opens is a usage error (exit 2)."""
    from accord.adapters.objects import (  # noqa: PLC0415 - boto3 only when it is named
        FileObjectStore,
        open_object_store,
        redact_url,
    )

    if url == "off":
        return None
    if url is None:
        return FileObjectStore(default) if default is not None else None
    try:
        return open_object_store(url)
    except ValueError as exc:
        usage(f"--claims {redact_url(url)!r}: {exc}")
