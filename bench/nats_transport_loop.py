"""The NATS transport alone, or bare nats-py doing the same: take N copies, ack them.

    python bench/nats_transport_loop.py ours|bare URL STREAM DURABLE N GROUP

No effect, no ledger, no engine: `ours` iterates NatsTransport.deliveries() and settles
every GROUP copies with one settle() of ACKs (as the consume loop settles a committed
group); `bare` pulls GROUP at a time as the consume ceiling does and acks each.
bench/nats_profile.py runs it under callgrind (sides transport, transport-bare) so the
instructions per message of the transport are read apart from the engine's and the
ledger's.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


async def ours(url: str, stream: str, durable: str, n: int, group: int) -> int:
    from onceq._core.transport import Settle
    from onceq._sources.nats.transport import NatsTransport

    t = NatsTransport(url, stream=stream, durable=durable, prefetch=group, until_empty=True)
    await t.open()
    await t.start()
    done = 0
    held: list[Any] = []
    try:
        async for d in t.deliveries():
            held.append((d, Settle.ACK, ""))
            if len(held) == group or done + len(held) == n:
                await t.settle(held)
                done += len(held)
                held = []
    finally:
        await t.close()
    return done


async def bare(url: str, stream: str, durable: str, n: int, group: int) -> int:
    """The ceiling's pull (bench/nats_end_to_end.py): a no-wait request for GROUP on the
    consumer's NEXT subject, the copies from the subscription's callback, each acked."""
    import collections
    import json

    import nats

    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        arrived: collections.deque[Any] = collections.deque()
        came = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            arrived.append(msg)
            came.set()

        await nc.subscribe(inbox, cb=on_msg)
        ask = json.dumps({"batch": group, "no_wait": True}).encode()
        done = 0
        while done < n:
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", ask, reply=inbox)
            got = 0
            while got < group:
                if not arrived:
                    came.clear()
                    await asyncio.wait_for(came.wait(), 5)
                    continue
                msg = arrived.popleft()
                if msg.headers and msg.headers.get("Status"):
                    break
                await msg.ack()
                got += 1
            done += got
        await nc.flush()
    finally:
        await nc.close()
    return done


if __name__ == "__main__":
    side, url, stream, durable, n, group = sys.argv[1:]
    fn = ours if side == "ours" else bare
    got = asyncio.run(fn(url, stream, durable, int(n), int(group)))
    if got != int(n):
        sys.exit(f"{side}: {got} of {n}")
