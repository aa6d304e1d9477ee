"""No task of the package waits for an event through asyncio.wait_for (see onceq._core.waits).

On Python 3.11 `asyncio.wait_for(event.wait(), seconds)` drops a cancel that lands in
the turn the event is set; a looping task then outlives its close. Every such wait goes
through `onceq._core.waits.wait`, which keeps the cancel; this test finds any that
does not, anywhere under src/onceq.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import onceq
from onceq._core.waits import wait

PACKAGE = Path(onceq.__file__).parent


def _event_waits_under_wait_for(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "wait_for"
            and node.args
            and isinstance(node.args[0], ast.Call)
            and isinstance(node.args[0].func, ast.Attribute)
            and node.args[0].func.attr == "wait"
            and not node.args[0].args  # event.wait(), not proc.wait(...) with arguments
            and not _is_process(node.args[0].func.value)
        ):
            lines.append(node.lineno)
    return lines


def _is_process(value: ast.expr) -> bool:
    """`proc.wait()` waits for a child process: no event, no lost cancel to fear."""
    return isinstance(value, ast.Name) and value.id in {"proc", "process", "child"}


def test_no_event_is_waited_for_through_wait_for() -> None:
    found = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _event_waits_under_wait_for(ast.parse(path.read_text())))
    }
    assert found == {}, f"use onceq._core.waits.wait instead: {found}"


def test_the_finder_sees_the_pattern() -> None:
    src = (
        "async def f(e):\n"
        "    await asyncio.wait_for(e.wait(), 1)\n"
        "    await asyncio.wait_for(proc.wait(), 2)\n"
    )
    assert _event_waits_under_wait_for(ast.parse(src)) == [2]


def test_wait_ends_on_its_event_or_its_time() -> None:
    async def main() -> tuple[bool, float]:
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        timed_out = await wait(event, 0.05)  # nothing set: the time runs out, no error
        waited = loop.time() - t0
        loop.call_later(0.01, event.set)
        return await wait(event, None) and not timed_out, waited

    is_set, waited = asyncio.run(main())
    assert is_set and 0.04 <= waited < 1.0
