"""`onceq nats setup`: create or check a flow's stream, dead-letter stream and consumer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_options import names_options, setup_options
from onceq._cli.nats import cli_url
from onceq._cli.output import Seconds, console, emit_json
from onceq._cli.run import load_or_exit
from onceq._core import loop as event_loop
from onceq._sources.nats.names import (
    DEFAULT_ACK_WAIT,
    DEFAULT_MAX_ACK_PENDING,
    nats_url,
)
from onceq._sources.nats.plugin import nats_of
from onceq._sources.nats.setup import Setup
from onceq._sources.nats.setup import setup as do_setup
from onceq.errors import UsageError


@click.command()
@names_options(
    ("--stream", "S", "The stream (work-queue retention)."),
    ("--subject", "SUBJ", "The subject the stream takes."),
    ("--durable", "D", "The durable pull consumer's name."),
    (
        "--dead-subject",
        "SUBJ",
        "Where dead letters go (default onceq.dead.S), kept in the stream S_DEAD.",
    ),
)
@click.option(
    "--ack-wait",
    type=Seconds(min=0, min_open=True),
    help=f"AckWait: seconds before an unacked copy is redelivered [default: {DEFAULT_ACK_WAIT:g}].",
)
@click.option(
    "--max-ack-pending",
    type=click.IntRange(1),
    help="MaxAckPending of the consumer, shared by every process on it (delayed retries"
    f" hold a slot while they wait) [default: {DEFAULT_MAX_ACK_PENDING}].",
)
@click.option(
    "--max-deliver",
    type=click.IntRange(-1),
    help="MaxDeliver (-1: no bound, the default: the ledger counts attempts).",
)
@setup_options(flows_help="Set up every nats flow of this flow file instead.")
def setup(
    stream: str | None,
    subject: str | None,
    durable: str | None,
    dead_subject: str | None,
    ack_wait: float | None,
    max_ack_pending: int | None,
    max_deliver: int | None,
    flow_file: Path | None,
    as_json: bool,
) -> None:
    """Create, or check, a flow's stream, dead-letter stream and durable pull consumer.

    The stream S takes SUBJ (file storage, work-queue retention: an acked message
    leaves it, and a 2 min duplicate window on Nats-Msg-Id); S_DEAD keeps the dead
    letters published to --dead-subject; the consumer D pulls SUBJ with explicit
    acks. What exists is checked, never changed: a setting that differs is one line
    naming it, exit 4. Nothing else is touched.

    \b
    Example:
      onceq nats setup --stream INVOICES --subject invoices --durable onceq
      onceq nats setup --flows flows.toml
    """
    if flow_file is not None:
        given = [stream, subject, durable, dead_subject, ack_wait, max_ack_pending, max_deliver]
        if any(v is not None for v in given):
            raise UsageError("--flows: the names come from the flow file; give no --stream etc.")
        specs = _flow_specs(flow_file)
    else:
        missing = [
            f
            for f, v in (("--stream", stream), ("--subject", subject), ("--durable", durable))
            if not v
        ]
        if missing:
            raise UsageError(f"nats setup: give {', '.join(missing)} (or --flows FILE)")
        assert stream and subject and durable
        spec = Setup(
            stream,
            subject,
            durable,
            dead_subject=dead_subject,
            ack_wait=DEFAULT_ACK_WAIT if ack_wait is None else ack_wait,
            max_ack_pending=DEFAULT_MAX_ACK_PENDING if max_ack_pending is None else max_ack_pending,
            max_deliver=-1 if max_deliver is None else max_deliver,
        )
        problems = spec.problems(lambda k: "--" + k.replace("_", "-"))
        if problems:
            raise UsageError(problems[0])
        specs = {cli_url(): [spec]}
    done: dict[str, str] = {}
    for url, wanted in specs.items():
        for spec in wanted:
            done.update(event_loop.run(do_setup(url, spec)))
    if as_json:
        emit_json(done)
        return
    for name, state in done.items():
        console().print(f"{name}: {state}", markup=False)


def _flow_specs(flow_file: Path) -> dict[str, list[Setup]]:
    """{server URL: the Setup of each nats flow there}, in the file's order."""
    ff = load_or_exit(flow_file, ())
    cli_url()
    out: dict[str, list[Any]] = {}
    for flow in ff.flows:
        source = nats_of(flow.source)
        if source is None:
            continue
        if not source.subject:
            raise UsageError(f"{flow_file}: flows.{flow.name}.subject: setup needs the subject")
        out.setdefault(nats_url(source.url), []).append(source.setup())
    if not out:
        raise UsageError(f"{flow_file}: no nats flow: nothing to set up")
    return out
