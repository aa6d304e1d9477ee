"""The flags `mq consume` and `nats consume` share, in one factory: --required, the flow
and HTTP flags, --max-seconds, --prefetch, --db, --timeout, --until-empty, the retry, breaker,
guard and ops flags, and --json. What differs between brokers (prefetch's default and
what it bounds, the default ledger, what "empty" means) is an argument."""

from __future__ import annotations

import click

from onceq._cli.broker_options import Decorator, stack
from onceq._cli.db_option import db_option
from onceq._cli.flow_options import flow_options
from onceq._cli.ops_options import ops_options
from onceq._cli.output import Seconds
from onceq._cli.retry_options import retry_options

__all__ = ["DEFAULT_TIMEOUT", "consume_options"]

DEFAULT_TIMEOUT = 10.0  # s per HTTP call


def consume_options(
    *,
    required_help: str,
    prefetch_default: int,
    prefetch_help: str,
    db_help: str,
    until_empty_help: str,
) -> Decorator:
    return stack(
        click.option("--required", metavar="A,B", help=required_help),
        flow_options(timeout=False),
        click.option(
            "--max-seconds",
            type=Seconds(min=0, min_open=True),
            help="Stop taking messages after N seconds (default: run until SIGTERM/SIGINT).",
        ),
        click.option(
            "--prefetch",
            default=prefetch_default,
            show_default=True,
            type=click.IntRange(1, 65535),
            help=prefetch_help,
        ),
        db_option(db_help),
        click.option(
            "--timeout",
            default=DEFAULT_TIMEOUT,
            show_default=True,
            type=Seconds(min=0, min_open=True),
            help="Seconds per HTTP call before it counts as a timeout.",
        ),
        click.option("--until-empty", is_flag=True, help=until_empty_help),
        retry_options,
        ops_options,
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    )
