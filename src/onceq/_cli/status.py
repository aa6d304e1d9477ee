"""`onceq status`: every flow at a glance (queue, ledger, consumers), once or live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.flow_options import flow_names_option
from onceq._cli.output import Seconds, console, emit_json
from onceq._cli.run import load_or_exit
from onceq._core.logs import setup as setup_logs
from onceq._ops.status import gather
from onceq._ops.status_watch import Rates
from onceq.errors import LedgerError, NotFound

DEFAULT_FILE = "flows.toml"


@click.command()
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@flow_names_option("Show only this flow (repeatable; default: every flow).")
@db_option(
    "Ledger to read (a path or a postgresql:// URL). Without FILE and ./flows.toml: every"
    " flow this ledger holds, ledger counts only. With FILE: instead of the file's ledger."
)
@click.option(
    "--management-url",
    "management_api",
    metavar="URL|off",
    help="RabbitMQ management API for unacked counts (default: EAI_RABBITMQ_API, else"
    " http://BROKER-HOST:15672 with the AMQP URL's login; off: none).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (stable keys).")
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh a live view until Ctrl-C, with rates (with --json: one document a line).",
)
@click.option(
    "--interval",
    type=Seconds(min=0.2),
    default=2.0,
    show_default=True,
    metavar="S",
    help="Seconds between refreshes of --watch.",
)
def status(
    file: Path | None,
    names: tuple[str, ...],
    db: Any,
    management_api: str | None,
    as_json: bool,
    watch: bool,
    interval: float,
) -> None:
    """Queue depths, ledger counts and consumer state of every flow; nothing is written.

    FILE is a flow file (default ./flows.toml when it exists). Per flow: the queue
    (dirq: inbox, processing, retry, error and the oldest inbox message's age;
    rabbitmq: ready/unacked/consumers of the work queue, each retry tier and the
    dead-letter queue), the ledger's processed, duplicates and dead letters by
    reason, and what each running consumer publishes (breaker, in flight; a
    consumer silent for 3 heartbeats is stale). Without FILE and ./flows.toml,
    --db names a ledger and every flow in it is shown, ledger counts only. The
    ledger is opened read-only and never created. A flow whose queue cannot be
    read shows why, as does a ledger that cannot be read. --watch redraws every
    --interval s with rates over the last minute until Ctrl-C. Exit 0 (a view was
    shown, or Ctrl-C ended the watch; SIGTERM 143); 2 a bad flow file (every
    mistake, one line each); 3 no flow file (and no --db); 8 a --db view whose
    ledger cannot be read.

    \b
    Example:
      onceq status                          # ./flows.toml
      onceq status flows.toml --flow invoices --json
      onceq status --db ./q/ledger.db       # every flow of a ledger
      onceq status flows.toml --watch --interval 5
    """

    # One masked stderr handler, aiormq's connection tracebacks quiet: a broker that is
    # down is the flow's queue_error in the view, said once, not a log line per try.
    setup_logs()
    flows, target = _flows_and_ledger(file, names, db)
    only = names if flows is None else ()

    def read() -> dict[str, Any]:
        doc = gather(flows, target, api=management_api, names=only)
        if doc["ledger"].get("error") and not doc["flows"]:
            raise LedgerError(doc["ledger"]["error"])
        return doc

    if watch:
        _watch(read, interval, as_json)
        return
    doc = read()
    if as_json:
        emit_json(doc)
        return

    console().print(_view(doc, None))


def _flows_and_ledger(
    file: Path | None, names: tuple[str, ...], db: Any
) -> tuple[list[Any] | None, Any]:

    if file is None and db is None:
        file = Path(DEFAULT_FILE)
        if not file.is_file():
            raise NotFound(
                f"no {DEFAULT_FILE} here: name a flow file (onceq status FILE) or a ledger"
                " (--db PATH|URL)"
            )
    if file is None:
        return None, db
    if not file.exists():
        raise NotFound(f"{file}: no such flow file")
    ff = load_or_exit(file, names)
    return ff.flows, db if db is not None else ff.ledger


def _watch(read: Any, interval: float, as_json: bool) -> None:
    """Refresh until Ctrl-C (exit 0) or SIGTERM (exit 143); the last frame stays on
    screen and the cursor is shown again.

    The signals only ask: the loop ends between two frames and leaves the Live view
    the normal way. An exception raised in the middle of a frame being written could
    leave half a frame and the cursor hidden; a second Ctrl-C, for someone who will not
    wait for a slow read, interrupts at once. With --json: one JSON document a line per
    refresh (each flow with its "rates"), for a script that follows it; no live view.
    """
    import signal

    stop = _Asked()
    code = 0

    def asked(signum: int, _frame: object) -> None:
        nonlocal code
        if stop.is_set():
            raise KeyboardInterrupt
        code = 143 if signum == signal.SIGTERM else 0
        stop.asked = True

    signal.signal(signal.SIGTERM, asked)
    # SIGINT ignored (a background job, nohup) stays ignored: only Python's own default
    # handler, the one a terminal's Ctrl-C meets, is replaced.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, asked)
    rates = Rates()
    try:
        if as_json:
            _watch_json(read, interval, rates, stop)
        else:
            _watch_live(read, interval, rates, stop)
    except KeyboardInterrupt:
        pass  # the second Ctrl-C; Live's exit has shown the cursor again
    if code:
        raise SystemExit(code)


class _Asked:
    """A stop flag the signal handler may set. Not a threading.Event: its set() takes a
    lock that the interrupted main thread may hold inside wait(), and a handler runs in
    that thread, so it would wait for itself forever. A plain attribute, read between
    short sleeps, cannot deadlock; a stop is seen within SLICE seconds."""

    SLICE = 0.05

    def __init__(self) -> None:
        self.asked = False

    def is_set(self) -> bool:
        return self.asked

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if asked; whether asked."""
        end = time.monotonic() + seconds
        while not self.asked and (left := end - time.monotonic()) > 0:
            time.sleep(min(self.SLICE, left))
        return self.asked


def _watch_live(read: Any, interval: float, rates: Any, stop: Any) -> None:
    from rich.live import Live

    doc = read()
    with Live(
        _view(doc, rates.add(doc)), console=console(), auto_refresh=False, transient=False
    ) as live:
        while not stop.wait(interval):
            doc = read()
            live.update(_view(doc, rates.add(doc)), refresh=True)


def _watch_json(read: Any, interval: float, rates: Any, stop: Any) -> None:
    import json
    import sys

    while not stop.is_set():
        doc = read()
        for name, r in rates.add(doc).items():
            doc["flows"][name]["rates"] = r
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
        stop.wait(interval)


def _num(n: Any) -> str:
    return "-" if n is None else str(n)


def _age(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _queue_cell(entry: dict[str, Any]) -> Any:
    from rich.text import Text

    if entry["queue_error"]:
        return Text(entry["queue_error"], style="red")
    q = entry["queue"]
    if q is None:
        return Text("-")
    if q["kind"] == "dirq":
        return Text(
            f"inbox {q['inbox']}  processing {q['processing']}  retry {q['retry']}"
            f"  error {q['error']}"
        )
    parts = []
    for item in q["queues"]:
        if not item["exists"]:
            parts.append(f"{item['state']} {item['name']}: absent")
            continue
        unacked = "" if item["unacked"] is None else f"/{item['unacked']}"
        parts.append(f"{item['state']} {item['ready']}{unacked}")
    return Text("  ".join(parts))


def _consumers_cell(entry: dict[str, Any]) -> Any:
    from rich.text import Text

    counts: dict[str, int] = {}
    in_flight = 0
    for c in entry["consumers"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
        if c["status"] == "running":
            in_flight += c.get("in_flight") or 0
    if not counts:
        return Text("-")
    text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if counts.get("running"):
        text += f" ({in_flight} in flight)"
    return Text(text, style="yellow" if counts.get("stale") else "")


def _view(doc: dict[str, Any], rates: dict[str, dict[str, Any]] | None) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"onceq status  {doc['generated_at']}"))
    for col, right in (
        ("flow", False),
        ("queue", False),
        ("oldest", True),
        ("processed", True),
        ("dup", True),
        ("dead", True),
        ("breaker", False),
        ("consumers", False),
    ):
        table.add_column(col, justify="right" if right else "left")
    if rates is not None:
        table.add_column("processed/s", justify="right")
        table.add_column("dead/s", justify="right")
    for name, e in doc["flows"].items():
        led = e["ledger"]
        q = e["queue"] or {}
        dead = "-" if led is None else str(led["dead"])
        if led is not None and led["dead_by_reason"]:
            dead += (
                " (" + ", ".join(f"{r} {n}" for r, n in sorted(led["dead_by_reason"].items())) + ")"
            )
        breaker = e["breaker"] or "-"
        row = [
            Text(name),
            _queue_cell(e),
            Text(_age(q.get("oldest_age_s"))),
            Text("-" if led is None else str(led["processed"])),
            Text("-" if led is None else str(led["duplicates"])),
            Text(dead, style="red" if led is not None and led["dead"] else ""),
            Text(breaker, style="red" if breaker == "open" else ""),
            _consumers_cell(e),
        ]
        if rates is not None:
            r = rates.get(name, {})
            row += [Text(_rate(r.get("processed_per_s"))), Text(_rate(r.get("dead_per_s")))]
        table.add_row(*row)
    notes = []
    ledger = doc["ledger"]
    where = ledger.get("target") or "-"
    if ledger.get("error"):
        notes.append(Text(f"ledger: {ledger['error']}", style="red"))
    elif ledger.get("note"):
        notes.append(Text(f"ledger {where}: {ledger['note']}"))
    else:
        notes.append(Text(f"ledger {where} ({ledger.get('kind')})"))
    if rates is not None:
        notes.append(Text("rates over the last minute; Ctrl-C to stop"))
    return Group(table, *notes)


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}"
