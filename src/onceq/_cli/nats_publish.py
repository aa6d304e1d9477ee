"""`onceq nats publish`: files to a JetStream subject, each acknowledged by the stream."""

from __future__ import annotations

from pathlib import Path

import click

from onceq._cli.broker_options import check_id_field, publish_options
from onceq._cli.nats import cli_url
from onceq._cli.output import console, emit_json
from onceq._core import loop as event_loop
from onceq._sources.message_files import load_messages
from onceq._sources.nats.publisher import check_subject
from onceq._sources.nats.publisher import publish as do_publish
from onceq.errors import Unroutable


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--subject", required=True, metavar="SUBJ", help="The subject to publish to.")
@publish_options(id_header="Nats-Msg-Id", window_help="Publishes awaiting their PubAck at once.")
def publish(
    files: tuple[str, ...], subject: str, id_field: str, window: int, as_json: bool
) -> None:
    """Publish each FILE as one message to SUBJECT, its id as Nats-Msg-Id, each stored.

    The body is the file's bytes unchanged; Nats-Msg-Id is the JSON's id field (guid
    unless --id-field): the stream drops a second copy of an id within its duplicate
    window, and says so (counted as a duplicate, not an error). A message counts once
    the stream acknowledged it. Every file is checked first: one unreadable, non-JSON
    or id-less file publishes nothing (exit 5). A message no stream takes, or one the
    stream did not acknowledge, exits 6.

    \b
    Example:
      onceq nats publish invoices/*.json --subject invoices --id-field invoiceId --json
    """
    check_id_field(id_field)
    check_subject(subject)
    url = cli_url()
    messages = load_messages([Path(f) for f in files], id_field)
    try:
        report = event_loop.run(do_publish(url, messages, subject, window=window))
    except Unroutable as exc:
        if as_json and getattr(exc, "report", None) is not None:
            emit_json(exc.report.as_dict())
        raise
    if as_json:
        emit_json(report.as_dict())
        return
    dups = (
        f", {len(report.duplicates)} duplicate(s) dropped by the stream"
        if report.duplicates
        else ""
    )
    console().print(
        f"published {report.published} message(s) to {subject}, all stored{dups}", markup=False
    )
