"""A broker that does not answer, through the real ``accord`` binary: ``worker run`` and ``engine
run`` try for ``--connect-timeout``, one log line per attempt, then refuse on one line naming the
transport (password masked), exit 1, never a traceback. A broker lost once running is retried,
each failure logged on one line (a relay to the real RabbitMQ is cut and restored), and the
process still stops cleanly."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from tests.services import ensure_rabbitmq, ensure_redis

ROOT = Path(__file__).resolve().parents[2]
ACCORD = Path(sys.executable).parent / "accord"
WORKER = "accord_worker_thumbnail_render.handler:worker"
SECRET = "s3cret-pw"
UNREACHABLE = {
    "bullmq": "bullmq://127.0.0.1:1/0",
    "amqp": f"amqp://guest:{SECRET}@127.0.0.1:1/",
}


def command(kind: str, transport: str, tmp: Path, *extra: str) -> list[str]:
    if kind == "worker":
        return [str(ACCORD), "worker", "run", WORKER, "--transport", transport,
                "--state", str(tmp / "state"), *extra]  # fmt: skip
    return [str(ACCORD), "engine", "run", "--store", f"sqlite:///{tmp / 'a.db'}",
            "--transport", transport, "--no-platform", "--state", str(tmp / "state"),
            *extra]  # fmt: skip


def accord(args: list[str]) -> tuple[int, str, str, float]:
    start = time.monotonic()
    done = subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


@pytest.mark.parametrize("kind", ["worker", "engine"])
@pytest.mark.parametrize("scheme", sorted(UNREACHABLE))
def test_an_unreachable_broker_is_a_bounded_one_line_refusal(
    tmp_path: Path, kind: str, scheme: str
) -> None:
    url = UNREACHABLE[scheme]
    rc, out, err, took = accord(command(kind, url, tmp_path, "--connect-timeout", "2s"))
    assert rc == 1, (rc, err[-2000:])
    assert "Traceback" not in out + err, err[-3000:]
    assert 1.5 < took < 15, f"took {took:.1f}s"  # it waited, and it stopped waiting
    assert SECRET not in out + err
    shown = url.replace(SECRET, "***")
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {kind} not started: transport {shown} not reachable")
    attempts = [line for line in err.splitlines() if "not reachable (attempt" in line]
    assert len(attempts) >= 2 and all(shown in line for line in attempts), err


@pytest.mark.parametrize("kind", ["worker", "engine"])
@pytest.mark.parametrize("bad", ["2", "soon", "2x"])
def test_a_bad_connect_timeout_is_a_usage_error(tmp_path: Path, kind: str, bad: str) -> None:
    rc, _, err, _ = accord(command(kind, "memory://", tmp_path, "--connect-timeout", bad))
    assert rc == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: --connect-timeout: duration")


@pytest.mark.parametrize("kind", ["worker", "engine"])
def test_an_unreachable_store_is_refused_on_one_line(tmp_path: Path, kind: str) -> None:
    ensure_redis()
    store = f"redis://default:{SECRET}@127.0.0.1:1/0"
    if kind == "worker":
        args = command(kind, "memory://", tmp_path, "--store", store)
    else:
        args = [str(ACCORD), "engine", "run", "--store", store, "--transport", "memory://",
                "--no-platform"]  # fmt: skip
    rc, out, err, took = accord(args)
    assert rc == 1, err[-2000:]
    assert "Traceback" not in out + err and SECRET not in out + err
    assert took < 15
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "127.0.0.1:1" in error


class CuttableLink:
    """A TCP relay to a real broker that a test can cut (every connection dropped, new ones
    refused) and restore, so a broker the process is connected to goes away without stopping
    the shared server."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._open: list[socket.socket] = []
        self._server: socket.socket | None = None
        self._lock = threading.Lock()

    def start(self) -> CuttableLink:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                near, _ = server.accept()
                far = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                self._open += [near, far]
            threading.Thread(target=self._relay, args=(near, far), daemon=True).start()

    @staticmethod
    def _relay(near: socket.socket, far: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([near, far], [], [], 0.5)
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    (far if end is near else near).sendall(data)
        except OSError:
            return
        finally:
            near.close()
            far.close()

    def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
            self._open.clear()


@pytest.mark.parametrize("kind", ["worker", "engine"])
def test_a_broker_lost_once_running_is_logged_on_one_line_per_failure(
    tmp_path: Path, kind: str
) -> None:
    ensure_rabbitmq()
    link = CuttableLink(5672).start()
    url = f"amqp://guest:guest@127.0.0.1:{link.port}/?prefix=lost{uuid.uuid4().hex[:8]}."
    proc = subprocess.Popen(
        command(kind, url, tmp_path, "--connect-timeout", "5s"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        time.sleep(3.0)  # connected and consuming
        assert proc.poll() is None, proc.communicate()
        link.cut()
        time.sleep(2.0)  # the connection and its channels fail, and are retried
        assert proc.poll() is None, proc.communicate()  # still alive
        link.start()
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        link.cut()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in out + err, err[-3000:]
    lost = [line for line in err.splitlines() if "unexpectedly closed" in line]
    assert lost, err[-2000:]  # the cut was noticed, and said so on one line
    stamped = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    assert all(stamped.match(line) for line in err.splitlines()), err[-3000:]
