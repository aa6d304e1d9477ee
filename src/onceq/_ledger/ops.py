"""What the ledger knows about failures, replays and dead-letter operations (schema 3 on).

A mixin of both ledgers (`onceq._ledger.sqlite.Ledger`, `onceq._ledger.pg.ledger.PgLedger`):
every read and write here is scoped to the ledger's flow, every write is one transaction
(`_transaction`), and the SQL is written once with `?` placeholders (translated for
PostgreSQL by `onceq._ledger.pg.sql`). Also the duplicate and failure reads of `dirq report`.

Attempts. A message's attempt number is durable: the failures recorded for its
msg_id, plus one. A replay resets it: `replays.reset_after` holds the newest
failure id of the msg_id when it was replayed, and only failures after it count.
So a dead message that an operator replays gets its immediate and delayed retries
again, while a crash (which writes no replay) never resets anything.

Dead-letter operations (`onceq mq dead replay|purge`, `onceq dirq replay --all`) are
audited in `dead_ops`: `start_op` writes the row (filter as given, queue, started_at)
BEFORE the first message is touched, `record_replays` / `record_purged` add what was
done in the same transaction as the replay rows, and `finish_op` stamps finished_at.
A killed operation keeps finished_at NULL and the count of what it did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from onceq._core.values import text
from onceq.errors import LedgerError, UsageError

if TYPE_CHECKING:
    import contextlib
    from pathlib import Path

    from onceq._ledger.rows import Tx

# A source's tag: its shape, not a list of the sources onceq has, so a new source needs
# no change here (the schema's CHECK is the same rule: onceq._ledger.schema.TRANSPORT_CHECK).
TRANSPORT_TAG = re.compile(r"[a-z][a-z0-9_]{0,31}")
OPS = ("replay", "purge")
# msg_ids per IN (…) list: far below SQLite's 32766 bound parameters.
_CHUNK = 500

# The failures of ?2 (a msg_id) in flow ?1 that count as attempts: those after its
# latest replay's reset_after. Both lookups use an index: failures_msg, replays_msg.
_ATTEMPTS = (
    "SELECT count(*) FROM failures WHERE flow = ?1 AND msg_id = ?2 AND id > coalesce("
    "(SELECT max(reset_after) FROM replays WHERE flow = ?1 AND msg_id = ?2), 0)"
)


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def since_text(since: datetime | str | None) -> str | None:
    """`since` as the ledger writes times (ISO 8601, UTC): a naive time is UTC."""
    if since is None:
        return None
    if isinstance(since, str):
        try:
            since = datetime.fromisoformat(since)
        except ValueError:
            raise UsageError(f"since: {since!r}: not an ISO 8601 time") from None
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return since.astimezone(UTC).isoformat(timespec="microseconds")


class Queries(Protocol):
    """A ledger as the SQL both kinds share sees it (retention, the operators' reads):
    `?` placeholders on both, what differs (the storage's size) a method of each."""

    @property
    def flow(self) -> str: ...
    @property
    def path(self) -> Path | str: ...
    @property
    def kind(self) -> str: ...

    def _transaction(self) -> contextlib.AbstractContextManager[Tx]: ...
    def _rows(
        self, sql: str, args: Sequence[Any] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]]]: ...
    def _q1(self, sql: str, args: Sequence[Any]) -> tuple[Any, ...] | None: ...
    def storage_size(self) -> dict[str, int]:
        """{part: bytes} of what the ledger takes (SQLite: file, wal; PostgreSQL: each
        ledger table)."""


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


class LedgerOps:
    """Attempts, dead letters, replays and the dead-letter operations' audit."""

    if TYPE_CHECKING:
        flow: str
        path: Path | str  # a file (Ledger) or a URL, its password masked (PgLedger)

        def _transaction(self) -> contextlib.AbstractContextManager[Tx]: ...
        def _rows(
            self, sql: str, args: Sequence[Any] = ()
        ) -> tuple[list[str], list[tuple[Any, ...]]]: ...
        def _q1(self, sql: str, args: Sequence[Any]) -> tuple[Any, ...] | None: ...

    # --- reads every kind of ledger answers with the same SQL --------------------------

    def duplicate_ids(self) -> list[str]:
        rows = self._rows(
            "SELECT DISTINCT msg_id FROM duplicates WHERE flow = ? ORDER BY msg_id", (self.flow,)
        )[1]
        return [r[0] for r in rows]

    def last_failure(self, ref: str) -> tuple[str, str] | None:
        """(reason, detail) of the newest failure recorded for `ref`."""
        row = self._q1(
            "SELECT reason, detail FROM failures WHERE ref = ? AND flow = ?"
            " ORDER BY id DESC LIMIT 1",
            (text(ref), self.flow),
        )
        return None if row is None else (row[0], row[1])

    # --- attempts ----------------------------------------------------------------------

    def failed_attempts(self, msg_id: str) -> int:
        """Failures of msg_id since its last replay: the attempts it has spent."""
        # text(): the failures row holds the msg_id as `record_failure` wrote it (a NUL
        # or a lone surrogate escaped), so the count finds it under the same form.
        row = self._q1(_ATTEMPTS, (self.flow, text(msg_id)))
        return int(row[0]) if row else 0

    def failures_in(self, conn: Tx, msg_id: str | None) -> int:
        """failed_attempts inside the writer's open transaction."""
        return int(conn.execute(_ATTEMPTS, (self.flow, text(msg_id))).fetchone()[0])

    # --- dead letters ------------------------------------------------------------------

    def dead_letters(
        self, reason: str | None = None, since: datetime | str | None = None
    ) -> list[dict[str, Any]]:
        """Every failure that made a message dead, oldest first; `reason` (exact) and
        `since` (at or after; a naive time is UTC) narrow it."""
        sql = (
            "SELECT msg_id, ref, reason, detail, attempt, at FROM failures"
            " WHERE flow = ? AND action = 'dead'"
        )
        args: list[Any] = [self.flow]
        if reason is not None:
            sql += " AND reason = ?"
            args.append(reason)
        if (at := since_text(since)) is not None:
            sql += " AND at >= ?"
            args.append(at)
        cols, rows = self._rows(sql + " ORDER BY id", args)
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def dead_info(self, msg_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Per msg_id its newest dead failure: {reason, detail, at, attempts}, attempts
        counted since its last replay. A msg_id never dead in this flow is left out."""
        ids = sorted({m for m in msg_ids if isinstance(m, str)})
        out: dict[str, dict[str, Any]] = {}
        for chunk in _chunks([text(m) for m in ids]):
            marks = ",".join("?" * len(chunk))
            _, rows = self._rows(
                "SELECT f.msg_id, f.reason, f.detail, f.at FROM failures AS f"
                f" WHERE f.flow = ? AND f.action = 'dead' AND f.msg_id IN ({marks})"
                " AND f.id = (SELECT max(g.id) FROM failures AS g WHERE g.flow = f.flow"
                " AND g.msg_id = f.msg_id AND g.action = 'dead')",
                (self.flow, *chunk),
            )
            for msg_id, reason, detail, at in rows:
                out[msg_id] = {"reason": reason, "detail": detail, "at": at, "attempts": 0}
            _, counts = self._rows(
                "SELECT f.msg_id, count(*) FROM failures AS f"
                f" WHERE f.flow = ?1 AND f.msg_id IN ({marks}) AND f.id > coalesce("
                "(SELECT max(r.reset_after) FROM replays AS r WHERE r.flow = ?1"
                " AND r.msg_id = f.msg_id), 0) GROUP BY f.msg_id",
                (self.flow, *chunk),
            )
            for msg_id, n in counts:
                if msg_id in out:
                    out[msg_id]["attempts"] = int(n)
        return out

    # --- replays -----------------------------------------------------------------------

    def record_replay(self, ref: str, msg_id: str | None = None, op: int | None = None) -> None:
        """One message given back to its queue by a human (`dirq replay FILE`): its
        attempts start again. Without msg_id, the newest failure of `ref` names it."""
        self.record_replays(op, [(ref, msg_id)])

    def record_replays(self, op_id: int | None, items: Sequence[tuple[str, str | None]]) -> None:
        """(ref, msg_id) pairs replayed, and op_id's count, in ONE transaction.

        Write it BEFORE the message is back in its queue (published, moved to the
        inbox): a consumer that takes it at once must find its attempts reset. A
        replay recorded whose move then failed only resets a count (harmless); the
        other order could let the message die again at once, on its old attempts.
        """
        now = utcnow()
        with self._transaction() as conn:
            for ref, msg_id in items:
                ref = text(ref)
                if msg_id is None:
                    row = conn.execute(
                        "SELECT msg_id FROM failures WHERE flow = ? AND ref = ?"
                        " ORDER BY id DESC LIMIT 1",
                        (self.flow, ref),
                    ).fetchone()
                    msg_id = row[0] if row else None
                msg_id = text(msg_id)
                reset = conn.execute(
                    "SELECT coalesce(max(id), 0) FROM failures WHERE flow = ? AND msg_id = ?",
                    (self.flow, msg_id),
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO replays (flow, ref, at, msg_id, op, reset_after)"
                    " VALUES (?,?,?,?,?,?)",
                    (self.flow, ref, now, msg_id, op_id, int(reset)),
                )
            if op_id is not None:
                self._add_to_op(conn, op_id, len(items))

    # --- dead-letter operations ---------------------------------------------------------

    def start_op(self, transport: str, op: str, filter: dict[str, Any], queue: str) -> int:
        """Open the audit row of a dead-letter operation; its id. Call it before the
        first message is touched, so even a killed operation is on record."""
        if not isinstance(transport, str) or not TRANSPORT_TAG.fullmatch(transport):
            raise ValueError(
                f"transport must be a source's tag (a lowercase identifier of at most 32"
                f" characters: amqp, dirq, nats …), not {transport!r}"
            )
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        as_json = json.dumps(filter, sort_keys=True, default=str)
        with self._transaction() as conn:
            # RETURNING, not lastrowid: the one form both ledgers' drivers give back.
            row = conn.execute(
                "INSERT INTO dead_ops (flow, transport, op, filter, queue, started_at)"
                " VALUES (?,?,?,?,?,?) RETURNING id",
                (self.flow, transport, op, as_json, text(queue), utcnow()),
            ).fetchone()
            return int(row[0])

    def record_purged(self, op_id: int, ids: Sequence[str]) -> None:
        """Append `ids` (msg_ids or refs removed) to op_id's audit row, and its count."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT ids FROM dead_ops WHERE id = ? AND flow = ?", (op_id, self.flow)
            ).fetchone()
            if row is None:
                raise LedgerError(f"{self.path}: no dead-letter operation {op_id} in this flow")
            # ensure_ascii: a lone surrogate (a file name that is not UTF-8) is written
            # as its escape and cannot make the row unstorable.
            merged = json.dumps([*json.loads(row[0]), *ids])
            conn.execute(
                "UPDATE dead_ops SET ids = ?, count = count + ? WHERE id = ?",
                (merged, len(ids), op_id),
            )

    def finish_op(self, op_id: int) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE dead_ops SET finished_at = ? WHERE id = ? AND flow = ?",
                (utcnow(), op_id, self.flow),
            )

    def dead_ops(self, limit: int = 50) -> list[dict[str, Any]]:
        """This flow's dead-letter operations, newest first; filter and ids decoded."""
        cols, rows = self._rows(
            "SELECT id, flow, transport, op, filter, queue, started_at, finished_at, count,"
            " ids FROM dead_ops WHERE flow = ? ORDER BY id DESC LIMIT ?",
            (self.flow, int(limit)),
        )
        out = []
        for r in rows:
            d = dict(zip(cols, r, strict=True))
            d["filter"], d["ids"] = json.loads(d["filter"]), json.loads(d["ids"])
            out.append(d)
        return out

    def _add_to_op(self, conn: Tx, op_id: int, n: int) -> None:
        cur = conn.execute(
            "UPDATE dead_ops SET count = count + ? WHERE id = ? AND flow = ?",
            (n, op_id, self.flow),
        )
        if cur.rowcount != 1:
            raise LedgerError(f"{self.path}: no dead-letter operation {op_id} in this flow")
