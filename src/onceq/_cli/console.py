"""`onceq console`: the operator's web page over a flow file's flows and ledger."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.ops_options import token_file_option
from onceq._cli.run import load_or_exit
from onceq._console.guard import read_token
from onceq._console.server import serve
from onceq._console.state import ConsoleState
from onceq._core.logs import say
from onceq._core.logs import setup as setup_logs
from onceq.errors import NotFound

DEFAULT_FILE = "flows.toml"
DEFAULT_PORT = 8025


@click.command()
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@db_option("Ledger to read (a path or a postgresql:// URL), instead of FILE's ledger.")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; any but a loopback address needs a token.",
)
@click.option("--read-only", is_flag=True, help="Serve no action at all: look, never change.")
@click.option(
    "--management-url",
    "management_api",
    metavar="URL|off",
    help="RabbitMQ management API for unacked counts (as `onceq status`).",
)
@token_file_option
def console(
    file: Path | None,
    db: Any,
    port: int,
    host: str,
    read_only: bool,
    management_api: str | None,
    token_file: Path | None,
) -> None:
    """Serve the operator's console (a web page) until Ctrl-C.

    Flows: each flow's rates, queue depths, oldest message, breaker and consumers,
    updating every 2 s. Failures: the dead letters (a RabbitMQ dead-letter queue,
    a directory queue's error/) grouped by reason; a group's messages; a message's
    body, properties and journey (as `onceq trace`). Actions: replay or purge one, a
    selection or a whole group, after a confirmation showing the count, by the same
    code as `mq dead replay|purge` and `dirq replay` (ledger reset, confirmed copy,
    audit row). Search: a message's journey by its exact id. The page's JSON API is
    described at /api/openapi.json.

    FILE is a flow file (default ./flows.toml); --db reads another ledger. Safe by
    default: it listens on 127.0.0.1; any other --host needs a token (--token-file
    or ONCEQ_CONSOLE_TOKEN; open the page as http://HOST:PORT/?token=TOKEN) and
    refuses to start without one; every change needs the page's CSRF token;
    --read-only serves no action. Exit 0 (stopped by Ctrl-C or SIGTERM); 2 a bad
    flow file or option, or another address without a token; 3 no flow file; 4 the
    port is in use.

    \b
    Example:
      onceq console flows.toml                    # http://127.0.0.1:8025/
      onceq console flows.toml --read-only --port 8026
      ONCEQ_CONSOLE_TOKEN=$(cat token) onceq console flows.toml --host 0.0.0.0
    """
    setup_logs()
    token = read_token(token_file)
    if file is None:
        file = Path(DEFAULT_FILE)
        if not file.is_file():
            raise NotFound(f"no {DEFAULT_FILE} here: name a flow file (onceq console FILE)")
    elif not file.exists():
        raise NotFound(f"{file}: no such flow file")
    ff = load_or_exit(file, ())
    state = ConsoleState(
        ff.flows, db if db is not None else ff.ledger, read_only=read_only,
        management_api=management_api,
    )  # fmt: skip
    serve(state, host, port, token, ready=lambda url: _listening(url))


def _listening(url: str) -> None:
    say(f"console: {url} (Ctrl-C stops it)", "console-listening", logging.INFO)
