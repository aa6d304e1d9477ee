"""The event loop of a run: asyncio's by default, uvloop's with ONCEQ_LOOP=uvloop."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import onceq
from onceq._core import loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_a_run_uses_asyncios_loop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loop.ENV, raising=False)
    assert loop.loop_factory() is None
    assert loop.run(_loop_module()).startswith("asyncio")


@pytest.mark.parametrize("value", ["uvloop", " UVLoop "])
def test_onceq_loop_uvloop_chooses_uvloop(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(loop.ENV, value)
    assert loop.run(_loop_module()).startswith("uvloop")


@pytest.mark.parametrize("value", ["asyncio", "", "nonsense"])
def test_any_other_value_is_asyncio(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(loop.ENV, value)
    assert loop.run(_loop_module()).startswith("asyncio")


def test_without_uvloop_the_run_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop.ENV, "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop → ImportError
    assert loop.loop_factory() is None
    assert loop.run(_loop_module()).startswith("asyncio")


def test_run_returns_the_result_and_closes_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loop.ENV, raising=False)
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        seen.append(asyncio.get_running_loop())
        return 7

    assert loop.run(main()) == 7
    assert seen[0].is_closed()


def test_onceq_run_consumes_on_the_chosen_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's run path (the CLI's too) goes through loop.run: an async effect
    sees asyncio's loop, or uvloop's with ONCEQ_LOOP=uvloop."""
    for env, expected in ((None, "asyncio"), ("uvloop", "uvloop")):
        if env is None:
            monkeypatch.delenv(loop.ENV, raising=False)
        else:
            monkeypatch.setenv(loop.ENV, env)
        seen: list[str] = []

        async def effect(doc: dict[str, object], seen: list[str] = seen) -> None:
            seen.append(type(asyncio.get_running_loop()).__module__)

        queue = onceq.MemoryTransport()
        queue.publish(json.dumps({"id": "m1"}).encode())
        flow = onceq.Flow("f", queue, onceq.MessageSpec(id_field="id"), effect=effect)
        stats = onceq.run(flow, ledger=tmp_path / f"{expected}.db", until_empty=True)["f"]
        assert stats.processed == 1
        assert seen and seen[0].startswith(expected), seen
