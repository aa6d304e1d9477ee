"""The cross-process in-flight guard: one copy of a msg_id in flight across processes.

`Consumer` already lets one copy of a msg_id in flight per process (`_take_turn`).
Twins of one message in two consumer processes (two hosts on one broker, a re-sent
copy, a redelivery after another consumer's connection dropped) could both call the
partner; the guard makes the second wait until the first is recorded, then the
ledger calls it a duplicate. The guard lives in the ledger's database, because that
is what every consumer of a flow shares:

- PostgreSQL (`onceq.pg.guard`): a session-level advisory lock per (flow, msg_id) on a
  connection of its own. The holder's death closes its session and the server drops
  its locks, so a kill -9 never leaves a lease that blocks a message for ever.
- SQLite: every consumer is on one host; see `Ledger.inflight_guard`.

Order in the loop (`Consumer._handle`): in-process turn → `claim` (waits while
another process holds the msg_id) → the duplicate check → the call → commit → settle
→ `release`. The duplicate check comes AFTER the claim: a twin that committed while
we waited is found then.

The guard is an optimisation of *calls*, never of correctness: if it is lost (its
connection drops), the loop goes on and the ledger's primary key still records each
message once; at worst a partner sees a twin's call (at-least-once).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class InflightGuard(Protocol):
    """What the loop asks of a cross-process guard (all calls from the event loop)."""

    async def claim(self, msg_id: str) -> None:
        """Return once this process holds msg_id's lease (waits while another holds it)."""

    async def release(self, msg_id: str) -> None:
        """Give msg_id's lease back (after its outcome is committed and settled)."""

    async def aclose(self) -> None:
        """Release everything and close what the guard holds (a connection)."""
