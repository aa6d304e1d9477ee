"""`--metrics-port`, `--metrics-host`, `--log-format`, `--log-level`: how a long run is watched.

The same four options on every long-running command (`mq consume`, `dirq consume`,
`onceq run`); the command gets them as one `OpsOptions` (keyword `ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._core.logs import LOG_FORMATS
from onceq._ops.telemetry import OpsOptions, Telemetry

OPS_KEYS = ("metrics_port", "metrics_host", "log_format", "log_level")


def ops_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--metrics-port",
            type=click.IntRange(1, 65535),
            metavar="PORT",
            help="Serve Prometheus metrics at http://HOST:PORT/metrics and health at /healthz.",
        ),
        click.option(
            "--metrics-host",
            # No default here: `onceq run` takes a flow file's [metrics] host unless
            # this flag is given; OpsOptions' default (127.0.0.1) applies otherwise.
            default=None,
            show_default="127.0.0.1",
            metavar="HOST",
            help="Address the metrics server listens on (0.0.0.0: every interface).",
        ),
        click.option(
            "--log-format",
            type=click.Choice(LOG_FORMATS),
            default="human",
            show_default=True,
            help="Log lines on stderr: human, or json (one object a line).",
        ),
        click.option(
            "--log-level",
            type=click.Choice(("debug", "info", "warning", "error")),
            default="warning",
            show_default=True,
            help="The least severe log lines shown.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def pop_ops(flags: dict[str, Any]) -> OpsOptions:
    """The four options out of a command's keyword arguments, as one OpsOptions."""
    values = {k: flags.pop(k) for k in OPS_KEYS if k in flags}
    return OpsOptions(**{k: v for k, v in values.items() if v is not None})


def telemetry_for(ops: OpsOptions) -> Telemetry:
    """The command's Telemetry, its port already bound: before the command checks its
    queue or opens its ledger, so a port in use (exit 4) consumes and creates nothing."""
    telemetry = Telemetry(ops)
    telemetry.bind()
    return telemetry


def token_file_option(f: Any) -> Any:
    """--token-file: the console's token (`onceq console`, `onceq run --console-port`)."""
    return click.option(
        "--token-file",
        type=click.Path(path_type=Path, dir_okay=False),
        metavar="FILE",
        help="The console's token, on FILE's first line (else ONCEQ_CONSOLE_TOKEN); needed"
        " for any console address but a loopback one.",
    )(f)
