"""The NATS transport alone, or bare nats-py doing the same: take N copies, ack them.

    python bench/nats_transport_loop.py ours|bare URL STREAM DURABLE N GROUP

No effect, no ledger, no engine: `ours` iterates NatsTransport.deliveries() and settles
every GROUP copies with one settle() of ACKs (as the consume loop settles a committed
group); `bare` fetches GROUP at a time with nats-py's pull subscription and acks each.
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
    import nats

    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().pull_subscribe_bind(durable, stream)
        done = 0
        while done < n:
            for m in await sub.fetch(group, timeout=5):
                await m.ack()
                done += 1
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
