"""`accord events to-cloudevent|from-cloudevent`, run as the installed ``accord`` binary: the
round trip through both commands gives the envelope back byte for byte as JSON, in both modes;
bad input is one line naming the problem and exit 1 (refused) or 2 (usage), never a traceback,
and with ``--json`` exactly one JSON document on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ACCORD = Path(sys.executable).parent / "accord"
FIXTURES = REPO / "schemas" / "fixtures" / "envelope" / "1" / "valid"


def accord(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ACCORD), *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def envelope(name: str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads((FIXTURES / name).read_text("utf-8"))["message"]
    return message


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("mode", ["structured", "binary"])
@pytest.mark.parametrize("name", ["full.json", "null-branch.json"])  # every fixture: unit tests
def test_round_trip_through_the_binary_is_lossless(tmp_path: Path, mode: str, name: str) -> None:
    source = tmp_path / "envelope.json"
    source.write_text(json.dumps(envelope(name)), "utf-8")
    out = accord("events", "to-cloudevent", str(source), "--mode", mode)
    assert out.returncode == 0, out.stderr
    event = json.loads(out.stdout)
    if mode == "binary":
        assert set(event) == {"headers", "body"}
        assert event["headers"]["ce-specversion"] == "1.0"
    else:
        assert event["specversion"] == "1.0" and event["id"] == envelope(name)["messageId"]
    back = accord("events", "from-cloudevent", "-", "--mode", mode, stdin=out.stdout)
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout) == envelope(name)


def test_json_flag_wraps_the_answer() -> None:
    text = json.dumps(envelope("null-causationId.json"))
    out = accord("events", "to-cloudevent", "-", "--json", stdin=text)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["mode"] == "structured"
    assert doc["event"]["accordnulls"] == "accordcausation"
    back = accord("events", "from-cloudevent", "-", "--json", stdin=json.dumps(doc["event"]))
    assert json.loads(back.stdout) == {
        "ok": True,
        "mode": "structured",
        "envelope": envelope("null-causationId.json"),
    }


REFUSED = [
    # (command, stdin, the one line names ...)
    ("to-cloudevent", "{not json", "not strict JSON"),
    ("to-cloudevent", json.dumps({**envelope("full.json"), "tenant": "a b"}), "tenant"),
    ("to-cloudevent", json.dumps({**envelope("full.json"), "extra": 1}), "extra"),
    (
        "from-cloudevent",
        json.dumps(envelope("full.json")),
        "not an attribute of the Accord mapping",
    ),
    ("from-cloudevent", json.dumps({"specversion": "1.0"}), "type: missing"),
]


@pytest.mark.parametrize(("command", "stdin", "named"), REFUSED)
def test_refused_input_is_one_line_and_exit_1(command: str, stdin: str, named: str) -> None:
    done = accord("events", command, "-", stdin=stdin)
    assert done.returncode == 1
    no_traceback(done)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr
    assert done.stdout == ""
    as_json = accord("events", command, "-", "--json", stdin=stdin)
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)  # exactly one JSON document
    assert doc["ok"] is False and doc["exit"] == 1 and named in doc["error"]


def test_an_event_that_is_not_a_valid_envelope_is_refused() -> None:
    """The mapping carries the attribute, the envelope contract refuses what comes back."""
    event = json.loads(
        accord("events", "to-cloudevent", "-", stdin=json.dumps(envelope("full.json"))).stdout
    )
    event["accordfence"] = "not hex"
    done = accord("events", "from-cloudevent", "-", stdin=json.dumps(event))
    assert done.returncode == 1
    assert "not a valid envelope@2: fence" in done.stderr


def test_binary_mode_input_shape_is_checked() -> None:
    done = accord(
        "events", "from-cloudevent", "-", "--mode", "binary", "--json", stdin='{"body": ""}'
    )
    assert done.returncode == 1
    assert '"headers"' in json.loads(done.stdout)["error"]
    done = accord(
        "events", "from-cloudevent", "-", "--mode", "binary", stdin='{"headers": {"ce-id": 1.5}}'
    )
    assert done.returncode == 1 and "headers.ce-id: not a string" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("events", "to-cloudevent", "/no/such/file.json"),
        ("events", "to-cloudevent", "-", "--mode", "sideways"),
        ("events", "from-cloudevent"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    done = accord(*args, stdin="{}")
    assert done.returncode == 2
    no_traceback(done)
    as_json = accord(*args, "--json", stdin="{}")
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout)["exit"] == 2
