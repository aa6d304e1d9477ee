"""A retry copy the broker does not confirm names its cause, from the broker's answer.

Before, every such warning said "declare the tiers: onceq mq topology …", also when
the tiers existed and the user's permissions had been revoked or the channel had
closed. Real broker, a vhost and a user of the test's own; `publish_copy` is the
function the transport calls for every DELAY, and `words` the warning's reason.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mq_stub import Script, scripted_partner
from mq_support import (
    claim_doc,
    cli,
    consumers,
    count,
    ctl,
    queues,
    start_consumer,
    vhost,
    wait_for,
    write_claims,
)
from onceq._sources.amqp.copy_cause import CAUSES, Failure, words
from onceq._sources.amqp.retry import publish_copy

FIX = "onceq mq topology --queue claim.in"


class _Copy:
    """What publish_copy reads of a delivery: the broker's message and its id."""

    def __init__(self, message: Any) -> None:
        self.token = message
        self.msg_id = "m-1"
        self.body = message.body


@pytest.fixture
def own_user(amqp_url: str) -> Iterator[tuple[str, str]]:
    """A user with every permission on the test's vhost (revoked by a test)."""
    user, v = f"u-{uuid.uuid4().hex[:8]}", vhost(amqp_url)
    ctl("add_user", user, "pw-copy-test")
    try:
        ctl("set_permissions", "-p", v, user, ".*", ".*", ".*")
        yield f"amqp://{user}:pw-copy-test@127.0.0.1:5672/{v}", user
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_user", user], capture_output=True, timeout=60)


async def _copy_after(url: str, before: str, tier_args: dict[str, Any] | None = None) -> Any:
    """Get a message on a fresh channel, do `before`, publish its copy to `tier`."""
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        setup = await conn.channel()
        work = await setup.declare_queue("work")
        if before != "no-tier":
            await setup.declare_queue("tier", arguments=tier_args)
        await setup.default_exchange.publish(aio_pika.Message(b"{}", message_id="m-1"), "work")
        await setup.close()
        channel = await conn.channel(publisher_confirms=True)
        queue = await channel.get_queue(work.name)
        for _ in range(50):
            message = await queue.get(fail=False)
            if message is not None:
                break
            await asyncio.sleep(0.05)
        if before == "revoke":
            ctl("set_permissions", "-p", url.rsplit("/", 1)[1], url.split("//")[1].split(":")[0],
                "", "", "")  # fmt: skip
        if before == "close":
            await channel.close()
        return await publish_copy(_Copy(message), "tier")  # type: ignore[arg-type]
    finally:
        await conn.close()


def test_revoked_permissions_are_named_and_do_not_say_declare_the_tiers(
    own_user: tuple[str, str],
) -> None:
    failure = asyncio.run(_copy_after(own_user[0], "revoke"))
    assert failure is not None and failure.cause == "access-refused"
    line = words(failure, queue="tier", fix=FIX)
    assert "ACCESS_REFUSED" in line and "permissions" in line
    assert "declare the tiers" not in line


def test_a_closed_channel_is_named(own_user: tuple[str, str]) -> None:
    failure = asyncio.run(_copy_after(own_user[0], "close"))
    assert failure is not None and failure.cause == "channel-closed"
    line = words(failure, queue="tier", fix=FIX)
    assert "closed before the broker confirmed" in line and "declare the tiers" not in line


def test_a_missing_tier_queue_says_declare_the_tiers(own_user: tuple[str, str]) -> None:
    failure = asyncio.run(_copy_after(own_user[0], "no-tier"))
    assert failure is not None and failure.cause == "returned"
    assert words(failure, queue="tier", fix=FIX) == (
        f"the broker returned it unroutable: no queue tier; declare the tiers: {FIX}"
    )


def test_a_nack_is_named(own_user: tuple[str, str]) -> None:
    # A full queue that rejects publishes: the broker's nack for the copy.
    args = {"x-max-length": 0, "x-overflow": "reject-publish"}
    failure = asyncio.run(_copy_after(own_user[0], "nack", args))
    assert failure is not None and failure.cause == "nacked"
    line = words(failure, queue="tier", fix=FIX)
    assert "nacked" in line and "declare the tiers" not in line


def test_a_confirmed_copy_is_no_failure(own_user: tuple[str, str]) -> None:
    assert asyncio.run(_copy_after(own_user[0], "nothing")) is None


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_every_cause_reads_as_one_sentence(cause: str) -> None:
    """Only a missing queue (404 or returned) points at the topology command."""
    line = words(Failure(cause, "5s" if cause == "no-confirm" else ""), queue="tier", fix=FIX)
    assert "{" not in line and line.strip() == line
    assert ("declare the tiers" in line) is (cause in ("not-found", "returned"))


def test_a_running_consumer_whose_permissions_are_revoked_names_it(
    amqp_url: str, own_user: tuple[str, str], tmp_path: Path
) -> None:
    """End to end: `mq consume` as a user of its own; its write permission revoked
    while it runs, the first retry copy is refused (403). The line names that, not the
    tiers (they exist); the original is given back and nothing is lost."""
    url, user = own_user
    assert cli(amqp_url, "mq", "topology", "--retry-delays", "1m").returncode == 0
    db = tmp_path / "p.db"
    with scripted_partner(Script({}, default=503)) as base:
        proc = start_consumer(
            url, base, db, "--retry-delays", "1m", "--immediate-retries", "0",
            "--no-breaker", policy=(),
        )  # fmt: skip
        try:
            wait_for(lambda: consumers(amqp_url) == 1, 30)
            # Write only: the copy is refused, and the robust channel that the 403
            # closed reopens and consumes again (read is still allowed).
            ctl("set_permissions", "-p", vhost(amqp_url), user, ".*", "", ".*")
            docs = write_claims(tmp_path / "c", [claim_doc("g1")])
            assert cli(amqp_url, "mq", "publish", *map(str, docs)).returncode == 0
            wait_for(lambda: count(db, "failures") >= 1, 30)
            ctl("set_permissions", "-p", vhost(amqp_url), user, ".*", ".*", ".*")
            # Given back, then its 2nd and last attempt of a 1-tier policy: dead.
            dead = True
            wait_for(lambda: queues(amqp_url)["claim.dead"][0] == 1, 60)
        except AssertionError:
            dead = False
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert dead and proc.returncode == 0, err
    [line] = [x for x in err.splitlines() if "claim.retry.1m" in x and "not confirmed" in x]
    assert "ACCESS_REFUSED (403)" in line and "declare the tiers" not in line, line
    for noise in ("Traceback", "Task exception was never retrieved", " at 0x"):
        assert noise not in err, err
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_a_consumer_whose_channel_is_closed_for_revoked_permissions_says_so_and_recovers(
    amqp_url: str, own_user: tuple[str, str], tmp_path: Path
) -> None:
    """Every permission revoked: the 403 closes the consume channel, and aio-pika's own
    reopen (a basic.consume) is refused too. Before, the consumer then idled for ever
    without a word; now the close is one line naming ACCESS_REFUSED, the channel is
    reopened once the permissions are back, and the message is handled."""
    url, user = own_user
    assert cli(amqp_url, "mq", "topology", "--retry-delays", "1m").returncode == 0
    db = tmp_path / "p.db"
    with scripted_partner(Script({}, default=503)) as base:
        proc = start_consumer(
            url, base, db, "--retry-delays", "1m", "--immediate-retries", "0",
            "--no-breaker", policy=(),
        )  # fmt: skip
        dead = False
        try:
            wait_for(lambda: consumers(amqp_url) == 1, 30)
            ctl("set_permissions", "-p", vhost(amqp_url), user, "", "", "")
            docs = write_claims(tmp_path / "c", [claim_doc("g1")])
            assert cli(amqp_url, "mq", "publish", *map(str, docs)).returncode == 0
            wait_for(lambda: consumers(amqp_url) == 0 and count(db, "failures") >= 1, 30)
            time.sleep(1.5)  # aio-pika's own reopen has been refused by now
            ctl("set_permissions", "-p", vhost(amqp_url), user, ".*", ".*", ".*")
            wait_for(lambda: queues(amqp_url)["claim.dead"][0] == 1, 60)
            dead = True
        except AssertionError:
            pass
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert dead and proc.returncode == 0, err
    [closed] = [x for x in err.splitlines() if "closed the consume channel" in x]
    assert "ACCESS_REFUSED" in closed, closed
    assert err.count("the consume channel is open again") == 1, err
    for noise in ("Traceback", "Task exception was never retrieved", " at 0x"):
        assert noise not in err, err
    assert queues(amqp_url)["claim.in"] == (0, 0)
