"""`onceq sample DIR`: copy the built-in orders and claims out, to try every example on."""

from __future__ import annotations

from pathlib import Path

import click

from onceq._cli.output import emit_json
from onceq._exercise.sample import copy_sample


@click.command()
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
def sample(dest: Path, as_json: bool) -> None:
    """Copy the built-in sample into DEST/orders/, DEST/claims/ and DEST/invoices/.

    The orders are the directory-queue sample (3 re-sent copies, 1 file that does
    not parse, 1 missing its amount); the claims are the RabbitMQ sample (1 re-sent
    copy, 1 without docs, 1 BUSY); the 8 invoices are the "your own flow" example
    (1 re-sent copy, 1 negative total, 1 BUSY customer, 1 without an id).
    Refused with exit 4, nothing copied, when any of the target files exists
    already.

    \b
    Example:
      onceq sample ./fixtures
      onceq dirq init ./q --from ./fixtures/orders
      onceq mq publish ./fixtures/claims/*.json
    """

    written = copy_sample(dest)
    if as_json:
        emit_json({name: [str(p) for p in files] for name, files in written.items()})
        return
    click.echo(
        f"{dest}: {len(written['orders'])} orders in {dest / 'orders'}, "
        f"{len(written['claims'])} claims in {dest / 'claims'}, "
        f"{len(written['invoices'])} invoices in {dest / 'invoices'}"
    )
