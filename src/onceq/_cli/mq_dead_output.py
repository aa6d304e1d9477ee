"""What `onceq mq dead` prints: the list's table, a change's summary line, the body
`show` writes. The words are those of the commands' --json (done, total, filter, left)."""

from __future__ import annotations

import sys
from typing import Any

from onceq._cli.output import console, emit_json, fail
from onceq._core.values import text
from onceq._sources.amqp.dead_body import shown_body
from onceq.errors import NotFound


def print_list(report: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    out = console()
    if report.matched:
        table = Table()
        for col in ("#", "message_id", "reason", "attempts", "dead at", "x-death", "size"):
            table.add_column(col, justify="right" if col in ("#", "attempts", "size") else "left")
        for x in report.matched:
            when = x.dead_at
            deaths = (
                "; ".join(
                    f"{d.queue} {d.reason} ×{d.count}"
                    + (f" {d.time.isoformat(timespec='seconds')}" if d.time else "")
                    for d in x.deaths
                )
                or "-"
            )
            cells = (
                str(x.position),
                text(x.msg_id) if x.msg_id is not None else "-",
                # A malformed letter's reason with where it is malformed (never a value).
                f"{x.reason}: {x.detail}" if x.refused is not None else x.reason,
                "-" if x.attempts is None else str(x.attempts),
                when.isoformat(timespec="seconds") if when else "-",
                deaths,
                str(x.size),
            )
            # Text, not markup: an id or a reason is printed as it is, brackets and all.
            table.add_row(*(Text(c) for c in cells))
        out.print(table)
    q = report.topology.dead_letter_queue
    what = report.selection.describe()
    out.print(
        f"{len(report.matched)} of {report.total} dead letter(s) in {q} shown"
        f"{'' if what == 'all' else f' ({what})'}; nothing removed",
        markup=False,
    )


def print_change(report: Any, as_json: bool) -> None:

    if as_json:
        emit_json(report.as_dict())
    else:
        console().print(change_summary(report), markup=False)
    for letter, why in report.skipped:
        q = report.topology.dead_letter_queue
        fail(f"{letter.msg_id!r}: not replayed, {why}; it stays in {q}")
    if report.missing:
        fail(
            f"not in {report.topology.dead_letter_queue}: {', '.join(report.missing)}"
            " (nothing done for these)"
        )


def change_summary(report: Any) -> str:
    """The last line of replay / purge, in the words of its JSON (done, total, filter,
    left, seconds, op)."""
    t = report.topology
    verb = {"replay": "replayed", "purge": "purged"}[report.command]
    filt = f"filter {report.selection.describe()}"
    where = (
        f" to {t.exchange or 'the default exchange'}, key {t.routing_key}"
        if report.command == "replay"
        else ""
    )
    if report.body is not None:
        where += f", body from {report.body.path}"
    if report.dry_run:
        ids = ", ".join(str(x.msg_id) for x in report.matched[:10])
        more = f" …(+{len(report.matched) - 10})" if len(report.matched) > 10 else ""
        return (
            f"dry run: would have {verb} {len(report.matched)} of {report.total} dead letter(s)"
            f" from {t.dead_letter_queue}{where}; {filt}"
            f"{': ' + ids + more if ids else ''}; nothing changed"
        )
    if report.declined:
        return f"purge declined: {len(report.matched)} dead letter(s) left in {t.dead_letter_queue}"
    op = f"; ledger op {report.op}" if report.op is not None else ""
    return (
        f"{verb} {len(report.done)} of {report.total} dead letter(s) from {t.dead_letter_queue}"
        f"{where}; {filt}; {report.left} left; {report.seconds:.1f}s{op}"
    )


def print_body(report: Any, msg_id: str, as_json: bool) -> None:
    """`show`: the body of the dead letter nearest the head with `msg_id`, on stdout as
    it is (a file to correct and replay with --body); notes on stderr."""

    q = report.topology.dead_letter_queue
    if not report.matched:
        raise NotFound(f"{q}: no dead letter with message_id {msg_id!r} ({report.total} in it)")
    letter = report.matched[0]
    body, utf8 = shown_body(letter.body)
    if as_json:
        emit_json({**letter.as_dict(), "body": body, "utf8": utf8, "same_id": len(report.matched)})
        return
    sys.stdout.write(body)
    sys.stdout.flush()
    if not utf8:
        sys.stderr.write(f"onceq: {q}: {msg_id!r}: its body is not UTF-8 (bytes as \\xNN)\n")
    if len(report.matched) > 1:
        sys.stderr.write(
            f"onceq: {q}: {len(report.matched)} dead letters have message_id {msg_id!r};"
            f" shown: the one at position {letter.position}\n"
        )
