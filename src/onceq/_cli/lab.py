"""`onceq lab …`: the seed exercises' exact file layouts, written over the package.

The scripts these commands write are thin: each imports onceq and calls the same
library functions as the `onceq dirq` / `onceq mq` commands.
"""

from __future__ import annotations

from pathlib import Path

import click

from onceq._cli.output import console, emit_json
from onceq._exercise.lab import fileq as lab_fileq
from onceq._exercise.lab import mq as lab_mq_module

ROOT = click.Path(path_type=Path, file_okay=False)


@click.group()
def lab() -> None:
    """Generate the seed exercises' file layouts (thin scripts over onceq).

    \b
    Example:
      onceq lab fileq --root /tmp/x     # seed 000 under /tmp/x/q
      onceq lab mq --root /tmp/x        # seed 001 under /tmp/x/eaimw/mq
    """


@lab.command()
@click.option("--root", type=ROOT, required=True, help="R: the exercise lives in R/q.")
@click.option(
    "--fixtures",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder of *.json to queue (default: the built-in sample).",
)
@click.option("--no-run", is_flag=True, help="Write the layout and scripts; do not consume.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def fileq(root: Path, fixtures: Path | None, no_run: bool, as_json: bool) -> None:
    """Seed 000: the directory queue exercise under R/q.

    Creates R/q/{inbox,processing,done,error}, queues the fixtures, writes
    schema.csv, consume.py, lag.sh, replay.sh and order-check.sql, then (unless
    --no-run) consumes and writes order-result.txt, dup.txt and error.csv.

    \b
    Example:
      onceq lab fileq --root /tmp/x && cat /tmp/x/q/order-result.txt
    """

    result = lab_fileq.run(root, fixtures=fixtures, no_run=no_run)
    if as_json:
        emit_json(result)
        return
    out = console()
    for line in lab_fileq.report_lines(result):
        out.print(line, markup=False)  # a path is printed as it is, brackets and all


@lab.command("mq")
@click.option("--root", type=ROOT, required=True, help="R: the exercise lives in R/eaimw/mq.")
def lab_mq(root: Path) -> None:
    """Seed 001: the RabbitMQ claims exercise under R/eaimw/mq.

    Writes mq-up.sh, topology.py, publish.py and consumer.py, runs mq-up.sh
    (starts or reuses the local broker, memory alarm at an absolute 512MiB) and
    writes status.txt.

    \b
    Example:
      onceq lab mq --root /tmp/x && python3 /tmp/x/eaimw/mq/topology.py
    """

    lab_mq_module.run(root)
