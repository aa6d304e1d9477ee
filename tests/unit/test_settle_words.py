"""Every "could not …" line a lost settle prints reads as English.

The line was built from the decision's value: a dead-letter read "could not dead".
Rendered here through the transport's own warning, for every decision.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from onceq._core.transport import SETTLE_VERBS, Delivery, Settle
from onceq._sources.amqp.copy_cause import Failure
from onceq._sources.amqp.transport import AmqpTransport


class _GoneMessage:
    """A delivery whose channel died: every settle raises as aio-pika's would."""

    async def ack(self) -> None:
        raise ConnectionError("gone")

    async def reject(self, requeue: bool = False) -> None:
        raise ConnectionError("gone")


def _lost_settle_line(
    decision: Settle, failed: Failure | None, caplog: pytest.LogCaptureFixture
) -> str:
    async def go() -> None:
        t = AmqpTransport("amqp://guest:guest@127.0.0.1:5672/", tiers=((5.0, "claim.retry.5s"),))
        t._held = 1
        d = Delivery(body=b"{}", ref="tag 7", msg_id="m-1", token=_GoneMessage())
        d.delay = 5.0
        await t._settle_one(d, decision, failed)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onceq.amqp.transport"):
        asyncio.run(go())
    (line,) = [r.getMessage() for r in caplog.records if "could not" in r.getMessage()]
    return line


def test_every_decision_has_a_verb() -> None:
    assert set(SETTLE_VERBS) == set(Settle)


@pytest.mark.parametrize("decision", list(Settle), ids=lambda s: s.value)
def test_a_lost_settle_names_what_it_could_not_do(
    decision: Settle, caplog: pytest.LogCaptureFixture
) -> None:
    line = _lost_settle_line(decision, None, caplog)
    assert f"could not {SETTLE_VERBS[decision]}, its channel is gone" in line, line
    assert "could not dead," not in line and "could not delay," not in line


def test_a_delay_whose_copy_failed_was_a_requeue(caplog: pytest.LogCaptureFixture) -> None:
    line = _lost_settle_line(Settle.DELAY, Failure("channel-closed"), caplog)
    assert "could not requeue, its channel is gone" in line, line
