"""An ASGI app on uvicorn inside the running event loop, on a loopback port the OS picks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["LoopbackServer"]


class _QuietServer(uvicorn.Server):
    """Leaves the process's signal handlers alone: it serves inside someone else's loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class LoopbackServer:
    """``async with LoopbackServer(app) as server: server.url`` — uvicorn on 127.0.0.1, port 0
    unless given, TLS when ``certfile``/``keyfile`` are."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        certfile: Path | None = None,
        keyfile: Path | None = None,
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            ws="none",
            ssl_certfile=str(certfile) if certfile else None,
            ssl_keyfile=str(keyfile) if keyfile else None,
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None
        self.scheme = "https" if certfile else "http"
        self.host = host
        self.port = 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it stopped
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, 10)
        self._task = None

    async def __aenter__(self) -> LoopbackServer:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
