"""The flags a broker's commands share, one factory per block (RabbitMQ's `mq`, NATS's
`nats`): what differs between brokers (a default, the name of the id's header) is an
argument, so a flag's spelling, type and bounds are written once.

    @publish_options(id_header="message_id", window_help="Publisher confirms …")
    @setup_options(flows_help="Declare the names of every rabbitmq flow …")

Only click is imported: `mq publish` is timed with its start-up (bench/mq_publish_rate.py).
The consuming commands' block, which needs the flow, retry and ops flags, is in
onceq._cli.broker_consume_options.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._core.fields import split_path
from onceq.errors import UsageError

__all__ = [
    "JSON_HELP",
    "Rate",
    "check_id_field",
    "names_options",
    "publish_options",
    "rate_option",
    "setup_options",
    "stack",
]

JSON_HELP = "Print the outcome as JSON."

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stack(*decorators: Decorator) -> Decorator:
    """Apply `decorators` as if written one above the other, the first on top (its flag
    listed first in --help)."""

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f

    return apply


def publish_options(*, id_header: str, window_help: str) -> Decorator:
    """--id-field (whose value becomes `id_header`), --window, --json."""
    return stack(
        click.option(
            "--id-field",
            default="guid",
            show_default=True,
            metavar="F",
            help=f"JSON field (a dotted path: invoice.id) whose value becomes {id_header}.",
        ),
        click.option(
            "--window",
            default=256,
            show_default=True,
            type=click.IntRange(1, 65535),
            help=window_help,
        ),
        click.option("--json", "as_json", is_flag=True, help=JSON_HELP),
    )


def check_id_field(id_field: str) -> None:
    """Refuse an --id-field the consumer could not read (its rule for a path, so the
    publisher and the consumer agree)."""
    try:
        split_path(id_field, "id_field")
    except UsageError:
        raise UsageError(f"--id-field: {id_field!r}: not a field name or dotted path") from None


def names_options(*names: tuple[str, str, str]) -> Decorator:
    """A setup command's object names, each (flag, metavar, help): a text option with
    no default of click's (the command derives what is not given from the others)."""
    return stack(*(click.option(flag, metavar=mv, help=h) for flag, mv, h in names))


def setup_options(*, flows_help: str, between: tuple[Decorator, ...] = ()) -> Decorator:
    """--flows FILE (every flow of the broker's kind in the file instead of the flags),
    then `between` (a command's own flags listed there), then --json."""
    return stack(
        click.option(
            "--flows",
            "flow_file",
            metavar="FILE",
            type=click.Path(path_type=Path, dir_okay=False),
            help=flows_help,
        ),
        *between,
        click.option("--json", "as_json", is_flag=True, help=JSON_HELP),
    )


class Rate(click.FloatRange):
    """Publishes per second: a number > 0. click's range alone lets nan and inf through
    (neither compares <= 0), which no pace can use: refused in the same words."""

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True)

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv} is not in the range x>0 (a finite number).", param, ctx)
        return rv


def rate_option() -> Decorator:
    """--rate N of a dead-letter replay (onceq._sources.pace), the same for every broker."""
    return click.option(
        "--rate",
        type=Rate(),
        metavar="N",
        help="Publish at most N messages per second (default: as fast as confirmed).",
    )
