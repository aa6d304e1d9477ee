"""`onceq dirq consume`: its own module, loaded only when it runs (cli/dirq.py's
LazyGroup), so `onceq dirq lag`, which a monitor runs every few seconds, imports
neither the runner nor the flow builder nor telemetry (asyncio) nor rich."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.dirq_args import DB_HELP, DEFAULT_REQUIRED, QDIR, parse_required
from onceq._cli.flow_flags import over_preset, own_flow
from onceq._cli.flow_options import check_http_flags, flow_options, is_generic
from onceq._cli.ops_options import ops_options, pop_ops, telemetry_for
from onceq._cli.output import emit_json, note_new_ledger, print_run_summary
from onceq._cli.progress import live_progress
from onceq._cli.retry_options import retry_options
from onceq._core.consumer import Stats
from onceq._core.hooks import RunHooks
from onceq._core.logs import setup as setup_logs
from onceq._exercise.dirq_batch import queue_error
from onceq._exercise.orders import orders_flow
from onceq._flows.batch import run_report
from onceq._flows.run_end import signal_name
from onceq._ledger.target import Target
from onceq._sources.dirq.open import DEAD_WORD
from onceq._sources.dirq.queue import DirQueue


@click.command()
@click.argument("qdir", type=QDIR)
@db_option(DB_HELP)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Consumer processes on this queue.",
)
@click.option(
    "--required",
    help="Comma-separated fields a message must have (default: msg_id,order_no,seq,amount,"
    " the orders preset; with --id-field: only the id).",
)
@click.option(
    "--max-bytes",
    default=1024 * 1024,
    show_default=True,
    type=click.IntRange(1),
    help="Files larger than this are not messages (consume quarantines them unread).",
)
@flow_options()
@retry_options
@ops_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def consume(
    qdir: Path,
    db: Target | None,
    workers: int,
    required: str | None,
    max_bytes: int,
    as_json: bool,
    **flags: Any,
) -> None:
    """Consume every message in QDIR/inbox into the ledger, effectively once.

    Each file is claimed by an atomic rename into processing/, recorded in the
    ledger (a duplicate msg_id is recorded as such), and moved to done/ only
    after the commit; bad files go to error/ with a reason. Files a killed
    consumer left in processing/ are recovered first.

    Without --id-field, --url, --group-field, --seq-field or --keep the messages
    are the exercise's orders (msg_id, order_no, seq, amount into the processed
    table). With them it is your own flow: the id from --id-field, and with
    --url each message is POSTed there (2xx done, 409 done as a partner
    duplicate, other 4xx quarantined; see --success … --transient).

    A transient failure (5xx, timeout, refused connection) is retried: once at
    once, then after 5s, 30s, 2m and 10m, then quarantined (--retry,
    --immediate-retries, --retry-delays change it; the orders preset has no
    retry: its only effect is the ledger row). A file waiting for its retry is
    in QDIR/retry/, due at its modification time; the run ends when inbox/,
    its claims and retry/ are empty, sleeping until the next retry is due. With
    --url a circuit breaker holds the files (back to inbox/, no attempt spent)
    while the partner keeps failing, probing it with one file at a time.

    Your own flow has a misconfiguration guard: when the first 10 files all
    fail permanently for the same reason (a missing --id-field, a 404, a
    401/403) the run stops before quarantining the rest, which stay in inbox/,
    and exits 10 with one line saying what is probably wrong (--guard-failures
    N, --no-guard). A run in which every file failed exits 11. The orders
    preset keeps the exercise's rule: every bad file quarantined, exit 0.

    Signals: this is a batch that is to empty the inbox, so a run that a signal
    stops did not finish, and says so by its exit code: Ctrl-C (SIGINT) or SIGTERM
    stops cleanly (nothing more is claimed, what is held is committed and moved,
    the rest stays in inbox/), prints the summary, and exits 130 (SIGINT) or 143
    (SIGTERM). A second signal stops at once (the next run recovers the claims).
    On a terminal a status line on stderr shows the progress; piped, nothing.

    --metrics-port PORT serves Prometheus metrics at http://127.0.0.1:PORT/metrics
    and /healthz until the run ends (with --workers, the children's counts summed
    by this process); a port in use exits 4 before anything is touched.

    \b
    Example:
      onceq dirq consume ./q --workers 2
      onceq dirq consume ./q --workers 2 --metrics-port 9464
      onceq dirq consume ./inv --id-field invoiceId --url http://127.0.0.1:9300/api/invoices
      onceq dirq consume ./inv --id-field invoiceId --keep customer,total --flow invoices
      onceq dirq consume ./inv --id-field invoiceId --url http://x:9300/i --retry-delays 1s,5s
    """

    ops = pop_ops(flags)
    setup_logs(ops.log_format, ops.log_level)
    flow = _consume_flow(qdir, workers, required, max_bytes, flags)
    telemetry = telemetry_for(ops)  # the port first: in use, nothing is touched
    hooks = RunHooks()
    hooks.ledger_created.append(note_new_ledger)
    # --workers N: N processes (the directory queue's own), which report only at their end.
    with live_progress(str(qdir), DEAD_WORD, hooks):
        report = run_report(
            [flow],
            db or DirQueue(qdir).default_db,
            until_empty=True,
            telemetry=telemetry,
            hooks=hooks,
            processes=True,
        )
    stats = report.stats[flow.name]
    # A clean stop prints what it did like a finished run's, then the one line and the
    # exit code (130 SIGINT, 143 SIGTERM; 10 or 11 for a run that ended, but not well).
    stopped = signal_name(report.signal) if report.signal is not None else ""
    _print_summary(qdir, stats, as_json, stopped_by=stopped)
    error = queue_error(report, flow)
    if error is not None:
        raise error


def _consume_flow(
    qdir: Path, workers: int, required: str | None, max_bytes: int, flags: dict[str, Any]
) -> Any:
    """The flags' flow: the orders preset, or the user's own (onceq._cli.flow_flags: the
    flow file's builder), with the retry and breaker flags (the preset keeps none unless
    given)."""

    if is_generic(flags):
        values = {**flags, "required": required, "qdir": qdir, "workers": workers}
        fixed = {"max_bytes": max_bytes, "http.concurrency": 5}
        return own_flow("dirq", values, fixed)
    check_http_flags(flags)
    flow = orders_flow(
        qdir,
        workers=workers,
        required=parse_required(required or DEFAULT_REQUIRED),
        max_bytes=max_bytes,
    )
    flow.name = flags.get("flow_name") or flow.name
    return over_preset(flow.validate(), flags)


def _print_summary(qdir: Path, stats: Stats, as_json: bool, stopped_by: str = "") -> None:
    if as_json:
        emit_json({**stats.as_dict(), **({"stopped_by": stopped_by} if stopped_by else {})})
        return
    print_run_summary(stats, head=f"{qdir}: ")
