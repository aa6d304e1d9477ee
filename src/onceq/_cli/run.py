"""`onceq run FILE` and `onceq check FILE`: the flows of a flow file."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import click

from onceq._cli.ops_options import ops_options, pop_ops, telemetry_for, token_file_option
from onceq._cli.output import Seconds, emit_json, fail, note_new_ledger, print_run_summary
from onceq._core.logs import say
from onceq._core.logs import setup as setup_logs
from onceq._core.redact import redact_url
from onceq._effects.http import HttpEffect
from onceq._flows.batch import run_report
from onceq._flows.file import FlowFileError, load_flows
from onceq._flows.file_retry import describe, summary
from onceq._flows.run_end import run_error
from onceq._ledger.target import describe as describe_target
from onceq.errors import Misconfigured

FLOW_FILE = click.Path(path_type=Path, dir_okay=False)


def load_or_exit(file: Path, names: tuple[str, ...]) -> Any:
    """The checked flow file, or every mistake on stderr (one line each) and exit 2."""
    try:
        return load_flows(file, names)
    except FlowFileError as exc:
        for line in exc.lines:
            fail(line)
        raise SystemExit(exc.exit_code) from None


@click.command()
@click.argument("file", type=FLOW_FILE)
@click.option("--json", "as_json", is_flag=True, help="Print the flows as JSON.")
def check(file: Path, as_json: bool) -> None:
    """Check a flow file: every mistake one line, exit 2; nothing is run or created.

    Reads FILE, resolves each ${ENV} and imports each function it names, and
    checks every key; it opens no ledger, queue folder or broker connection.
    A flow file holds one ledger (a path, or a postgresql:// URL: a ledger shared
    by consumers on many hosts, e.g. ledger = "postgresql://onceq:${PGPASSWORD}@db/app")
    and one [flows.NAME] table per flow: a source
    (dirq: path; rabbitmq: queue, url, exchange, …), the message (id_field,
    required, group_field, seq_field, keep), an effect ([flows.NAME.http],
    [flows.NAME.python] function = "module:func", [flows.NAME.sql]), and
    optionally retry = "default"|"exercise"|"none" or [flows.NAME.retry]
    (immediate, delays), [flows.NAME.breaker] (enabled, failures, probe,
    max_probe) and [flows.NAME.guard] (enabled, failures; or guard = false),
    and a top-level [metrics] table (port, host) where `onceq run`
    serves /metrics and /healthz. Each flow's line shows the retry policy and
    breaker it runs with.

    \b
    Example (flows.toml):
      ledger = "ledger.db"
      [flows.invoices]
      source = "dirq"
      path = "inv"
      id_field = "invoiceId"
      keep = ["customer", "total"]
      [flows.invoices.http]
      url = "http://127.0.0.1:9300/api/invoices"
      headers = { X-Api-Key = "${INVOICE_API_KEY}" }
      [flows.invoices.retry]
      immediate = 1
      delays = ["5s", "30s", "2m"]
      [flows.invoices.breaker]
      failures = 5
      probe = "1s"

    \b
      onceq check flows.toml && onceq run flows.toml --until-empty
    """
    ff = load_or_exit(file, ())
    rows = [
        {
            "name": f.name,
            "source": f.kind,
            "effect": _effect_word(f),
            "sql": f.sql is not None,
            **describe(f),
        }
        for f in ff.flows
    ]
    if as_json:
        emit_json(
            {"file": str(file), "ledger": describe_target(ff.ledger), "flows": rows, "ok": True}
        )
        return
    for f, r in zip(ff.flows, rows, strict=True):
        sql = " + sql" if r["sql"] else ""
        click.echo(f"{file}: flow {r['name']}: {r['source']} -> {r['effect']}{sql}; {summary(f)}")
    click.echo(f"{file}: OK, {len(rows)} flow(s), ledger {describe_target(ff.ledger)}")


def _console(ff: Any, flags: dict[str, Any]) -> Any:
    """The console beside the run (--console-port), listening before the first message."""
    port, host = flags.pop("console_port", None), flags.pop("console_host", "127.0.0.1")
    token_file = flags.pop("token_file", None)
    if port is None:
        return None
    # why: aiohttp's server and the page load only when a console is asked for
    from onceq._console import server

    console = server.beside_run(ff.flows, ff.ledger, host, port, token_file)
    say(f"console: {server.url_of(host, port)}", "console-listening", logging.INFO)
    return console


def _effect_word(flow: Any) -> str:

    if flow.effect is None:
        return "ledger row"
    if isinstance(flow.effect, HttpEffect):
        # stdout masks only remembered passwords (4+ characters): a URL onceq prints
        # is masked where it is formatted, so `http://bob:pw@…` shows no `pw` either.
        return f"{flow.effect.method} {redact_url(flow.effect.url)}"
    return "python"


@click.command()
@click.argument("file", type=FLOW_FILE)
@click.option(
    "--flow",
    "names",
    multiple=True,
    metavar="NAME",
    help="Run only this flow (repeatable; default: every flow in FILE).",
)
@click.option(
    "--until-empty",
    is_flag=True,
    help="A batch: stop once every source is empty and nothing is in flight.",
)
@click.option(
    "--max-seconds",
    type=Seconds(min=0, min_open=True),
    help="Stop every flow cleanly after N seconds (default: run until SIGTERM/SIGINT).",
)
@ops_options
@click.option(
    "--console-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve the operator's console (as `onceq console FILE`) on PORT during the run.",
)
@click.option(
    "--console-host",
    default="127.0.0.1",
    show_default=True,
    help="Address of --console-port; any but a loopback address needs a token.",
)
@token_file_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def run(
    file: Path,
    names: tuple[str, ...],
    until_empty: bool,
    max_seconds: float | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Run the flows of a flow file in one process, into the file's one ledger.

    FILE is TOML: one ledger, one [flows.NAME] table per flow (`onceq check
    --help` shows one).
    The file is checked first, whole: any mistake is one line each, exit 2, and
    nothing is consumed. Then every source is checked (queue folder, broker
    queue) before the ledger is opened. A directory queue is looked at every
    0.5 s until the run stops. A transient failure follows the flow's retry
    policy (default: one immediate retry, then 5s, 30s, 2m and 10m, then dead:
    retry/ on a directory queue, the retry queues on RabbitMQ), and a flow's
    circuit breaker stops calling a partner that is down.

    Signals: without --until-empty this runs until stopped, so SIGTERM, SIGINT or
    --max-seconds stop every flow cleanly (what is held is recorded and settled)
    and it exits 0. With --until-empty it is a batch: 0 once every source is
    empty, 130/143 when a signal stops it first, 1 when --max-seconds does, 11
    when a flow received messages and every one failed. A second signal stops
    at once (the next run recovers what was claimed). A flow whose first 10
    messages all fail permanently for the same reason (a missing field, a 404,
    a 401/403: a misconfiguration) stops the whole run cleanly, exit 10 with
    one line naming it; a flow's `guard` key sets or turns off that guard.

    --console-port serves the operator's console (`onceq console --help`) for the
    run's length; a port in use exits 4 before anything is touched.

    --metrics-port (or the file's [metrics] port; the flag wins) serves Prometheus
    metrics at /metrics and a health check at /healthz until the run's end; a port
    in use exits 4 before anything is touched.

    \b
    Example:
      onceq partner invoices --port 9300 &
      onceq run flows.toml --until-empty
      onceq run flows.toml --flow invoices --max-seconds 60 --json
      onceq run flows.toml --console-port 8025 &    # http://127.0.0.1:8025/
      onceq run flows.toml --metrics-port 9464 &
      curl -s http://127.0.0.1:9464/metrics; curl -s http://127.0.0.1:9464/healthz
    """
    import dataclasses

    host_flag = flags.get("metrics_host")
    ops = pop_ops(flags)
    setup_logs(ops.log_format, ops.log_level)
    ff = load_or_exit(file, names)
    # The flow file's [metrics] unless a flag says otherwise; bound before any source.
    ops = dataclasses.replace(
        ops,
        metrics_port=ops.metrics_port if ops.metrics_port is not None else ff.metrics_port,
        metrics_host=host_flag or ff.metrics_host or ops.metrics_host,
    )
    telemetry = telemetry_for(ops)
    console = _console(ff, flags)
    try:
        report = run_report(
            ff.flows,
            ff.ledger,
            until_empty=until_empty,
            max_seconds=max_seconds,
            telemetry=telemetry,
        )
    finally:
        if console is not None:
            console.close()
    error = run_error(
        report,
        ff.flows,
        batch=until_empty,
        where=lambda f: f"flow {f.name}",
        unfinished=lambda name, _aborted: _unfinished(file, name, max_seconds),
    )
    if isinstance(error, Misconfigured):
        raise error  # a flow's guard stopped the run: its one line, no summary (exit 10)
    if report.created:
        note_new_ledger(ff.ledger)
    if as_json:
        out = report.as_dict()
        if report.signal is not None:
            out["stopped_by"] = signal.Signals(report.signal).name
        emit_json(out)
    else:
        for name, stats in report.stats.items():
            tail = ""
            if name in report.drained:
                if report.unsettled[name]:
                    tail += f", {report.unsettled[name]} unsettled (back to the queue)"
                if report.drained[name]:
                    tail += "; drained"
            print_run_summary(stats, head=f"{name}: ", tail=tail)
        click.echo(f"ledger {describe_target(ff.ledger)}")
    if error is not None:
        raise error  # a batch stopped first (130/143, 1) or that only failed (11)


def _unfinished(file: Path, signal_name: str | None, max_seconds: float | None) -> str:
    if signal_name is not None:
        return f"{file}: stopped by {signal_name} before every source was empty"
    return f"{file}: not every source was empty within --max-seconds {max_seconds:g}"
