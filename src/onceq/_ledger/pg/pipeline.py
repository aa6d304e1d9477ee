"""psycopg's pipeline mode, and what a pipeline that failed leaves behind.

The ledger's writer sends a group's statements in pipelines (`onceq._ledger.pg.reconnect`),
the in-flight guard its claim batches (`onceq._ledger.pg.guard`). A pipeline that fails
can leave the connection stuck in pipeline mode (closed here: it is then a lost
connection), or psycopg believing a statement prepared that the server never
prepared (`forget_prepared`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

__all__ = ["forget_prepared", "pipeline"]


@contextlib.contextmanager
def pipeline(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """`conn.pipeline()`, and a connection psycopg could not take out of pipeline mode
    closed: a session terminated half-way through a pipeline, before libpq noticed,
    raised "cannot exit pipeline mode while busy" on a connection that was neither
    closed nor broken, so it was not seen as lost and the group failed instead of
    being written again. Closed, it is lost (`reconnect.is_connection_error`):
    reconnected, and a COMMIT that may have gone out is looked up, as for any other
    loss. A pipeline that failed otherwise may have skipped a statement's
    preparation (`forget_prepared`)."""
    try:
        with conn.pipeline():
            yield
    except BaseException:
        stuck = conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
        if stuck or not (conn.closed or forget_prepared(conn)):
            conn.close()
        raise


def forget_prepared(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """After a pipeline that failed: psycopg forgets the statements it prepared, and
    deallocates the server's with its next statement. False when this psycopg cannot:
    the caller then closes the connection (a new session prepares nothing; the writer
    and the guard reconnect as after any loss).

    psycopg prepares a text on its sixth run and counts it as prepared as soon as the
    Parse is queued; in a pipeline it never checks that Parse's answer. A statement
    that fails earlier in the pipeline makes the server skip the rest up to the Sync,
    the Parse with them, and from then on every run of that text failed with
    "prepared statement _pg3_N does not exist" (psycopg 3.3.9): a ledger whose
    optimistic insert met a redelivered copy just as a lookup was being prepared could
    write no group again. `_prepared.clear()` is what psycopg itself does after a
    DISCARD ALL."""
    clear = getattr(getattr(conn, "_prepared", None), "clear", None)
    if not callable(clear):
        return False
    clear()
    return True
