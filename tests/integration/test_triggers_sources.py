"""The sources file of `accord serve --trigger-sources`: each mistake named, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from accord.adapters.ingress.triggers import SourcesError, load_sources
from accord.cli import app

GOOD = "sources:\n  shop:\n    keys: { k1: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw }\n"


def test_a_good_file_reads_with_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD + "workflows: [wf]\ntenant: acme\n", encoding="utf-8")
    sources = load_sources(path)
    shop = sources.get("shop")
    assert shop is not None and shop.tenants == ("default",) and shop.tolerance_s == 300
    assert sources.workflows == ("wf",) and sources.tenant == "acme"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1, 2]", "a mapping with 'sources'"),
        ("sources: {}\ncolour: red\n", "unknown field(s) colour"),
        ("sources:\n  shop: 3\n", "sources.shop: a mapping is expected"),
        ("sources:\n  shop: {}\n", "sources.shop.keys"),
        ("sources:\n  shop: { keys: { k1: plain } }\n", "sources.shop.keys.k1"),
        (GOOD.replace("}\n", "}\n    tenants: []\n"), "sources.shop.tenants"),
        (GOOD.replace("}\n", "}\n    tolerance_s: 301\n"), "sources.shop.tolerance_s"),
        (GOOD.replace("}\n", "}\n    secret: x\n"), "unknown field(s) secret"),
        (GOOD + "workflows: wf\n", "workflows"),
        ("sources: [\n", "not YAML or JSON"),
    ],
)
def test_each_mistake_names_the_file_and_field(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SourcesError) as caught:
        load_sources(path)
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_serve_refuses_a_missing_sources_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--trigger-sources", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2
    assert "--trigger-sources" in result.output and "Traceback" not in result.output


async def test_mount_triggers_runs_the_schedules_and_message_triggers_it_names(
    tmp_path: Path,
) -> None:
    import asyncio
    import json
    import time

    from tests.integration._triggers_kit import (
        MESSAGE,
        WEBHOOK,
        engines,
        plan,
        schedule,
        sqlite_opener,
    )

    from accord.adapters.clock import SystemClock
    from accord.adapters.ingress.app import create_app
    from accord.adapters.ingress.control import ControlStore
    from accord.adapters.ingress.triggers import mount_triggers

    triggers = "\n".join([schedule(), WEBHOOK, MESSAGE.replace("{queue}", "mounted.events")])
    p = plan(triggers, name="mounted")
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("shop:", "storefront:") + "workflows: [mounted]\n", "utf-8")
    async with engines(sqlite_opener(tmp_path), SystemClock(), p, count=1) as (engine,):
        control = ControlStore(tmp_path / "control.db")
        app = create_app(engine, control)
        runtime = await mount_triggers(app, engine, path, run=True)
        try:
            assert app.state.triggers is runtime.intake
            assert runtime.scheduler is not None and runtime.scheduler.workflows == ["mounted"]
            [consumer] = runtime.consumers
            assert consumer.queue == "mounted.events"
            await engine.transport.publish(
                "mounted.events", "e1", json.dumps({"modelId": "x"}).encode()
            )
            deadline = time.monotonic() + 15
            while not consumer.started:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            state = await runtime.scheduler.state("mounted", "every-minute")
            assert state is not None and state["paused"] is False  # the scheduler saw it
        finally:
            await runtime.stop()
            control.close()
