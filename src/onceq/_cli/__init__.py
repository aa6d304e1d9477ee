"""The `onceq` command: parse, call the library, print, map errors to exit codes.

Each command's module is imported only when that command runs (`COMMANDS`, a
LazyGroup), so `onceq dirq lag` and `--help` start in a few tens of ms: the heavy
modules (rich, aio-pika, aiormq, aiohttp, sqlite3) stay behind the commands that
need them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import click

from onceq._cli.flow_options import UNQUOTED, remember_header_words
from onceq._cli.lazy import LazyGroup
from onceq._core import faults
from onceq._core.logs import say
from onceq._core.redact import MASK, guarded_stdio
from onceq.errors import OnceqError, redact_text

# name -> (module, command, the first sentence of its help: what `onceq --help` lists
# without importing the module; tests/unit/test_cli_lazy.py keeps them equal).
COMMANDS = {
    "check": (
        "onceq._cli.run",
        "check",
        "Check a flow file: every mistake one line, exit 2; nothing is run or created.",
    ),
    "console": (
        "onceq._cli.console",
        "console",
        "Serve the operator's console (a web page) until Ctrl-C.",
    ),
    "demo": (
        "onceq._cli.demo",
        "demo",
        "Run the built-in sample (20 orders) through a directory queue into SQLite.",
    ),
    "dirq": (
        "onceq._cli.dirq",
        "dirq",
        "A queue that is a folder: inbox/ processing/ done/ error/.",
    ),
    "lab": (
        "onceq._cli.lab",
        "lab",
        "Generate the seed exercises' file layouts (thin scripts over onceq).",
    ),
    "ledger": (
        "onceq._cli.ledger_cmd",
        "ledger",
        "The ledger itself: what it holds (stats) and removing its old rows (prune).",
    ),
    "mq": (
        "onceq._cli.mq",
        "mq",
        "RabbitMQ: topology, confirming publisher, manual-ack consumer with DLQ.",
    ),
    "nats": (
        "onceq._cli.nats",
        "nats",
        "NATS JetStream: stream and consumer setup, de-duplicating publisher, pull consumer.",
    ),
    "partner": (
        "onceq._cli.partner",
        "partner",
        "Stub partner systems for demos, tests and benchmarks.",
    ),
    "run": (
        "onceq._cli.run",
        "run",
        "Run the flows of a flow file in one process, into the file's one ledger.",
    ),
    "sample": (
        "onceq._cli.sample",
        "sample",
        "Copy the built-in sample into DEST/orders/, DEST/claims/ and DEST/invoices/.",
    ),
    "status": (
        "onceq._cli.status",
        "status",
        "Queue depths, ledger counts and consumer state of every flow; nothing is written.",
    ),
    "trace": (
        "onceq._cli.trace",
        "trace",
        "One message's journey from the ledger, in time order; nothing is written.",
    ),
}

EPILOG = (
    "Exit codes: 0 ok, 1 threshold exceeded / check failed, 2 bad usage, 3 not found"
    " (a missing queue folder, file or ledger), 4 conflict, 5 bad message, 6 unroutable,"
    " 7 broker unavailable (or no such vhost), 8 ledger error, 9 queue folder not"
    " writable, 10 misconfigured (the first messages all failed alike: stopped before"
    " rejecting the rest), 11 every message of a batch failed, 130 interrupted (SIGINT),"
    " 143 stopped (SIGTERM). `dirq lag` keeps a"
    " monitor's contract: 0 within, 1 over, 2 for any bad argument (a missing folder too)."
    " Signals: a consumer that runs until it is stopped (mq consume) exits 0 after"
    " SIGTERM, SIGINT or --max-seconds; a batch that is to finish a queue (dirq consume,"
    " mq consume --until-empty)"
    " exits 130/143 when a signal stops it, so a script knows it did not finish."
)


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="onceq")
def app() -> None:
    """Consume messages effectively once: at-least-once delivery + a dedup ledger.

    \b
    Example:
      onceq demo                       # the built-in sample through a directory queue
      onceq dirq consume ./q           # consume a queue folder into ./q/ledger.db
      onceq mq consume --claim http://127.0.0.1:9202 --max-seconds 30
    """
    if faults.pending():
        # A crash test armed a point no type loaded so far declares: refuse a mistyped
        # one before any command changes anything. Imported here, not at the top: the
        # registry brings asyncio, which `--help` and `dirq lag` must not load.
        from onceq._sources import registry

        registry.check_fault()


def _register() -> None:
    """Import every command (what walks the whole tree: the tests, the docs checks)."""
    app.load_all()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn our errors into one line and an exit code.

    Everything the command writes to stdout/stderr (rich, click, logging, a traceback)
    passes through the URL-password masking: the last line of defence.
    """
    with guarded_stdio():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    unquoted = remember_header_words(sys.argv[1:] if argv is None else argv)
    try:
        code = app.main(args=argv, prog_name="onceq", standalone_mode=False)
    except click.exceptions.Abort:
        sys.stderr.write("onceq: interrupted\n")
        sys.exit(130)
    except click.UsageError as exc:
        sys.stderr.write(_usage_line(exc, unquoted))
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        sys.stderr.write(f"onceq: {redact_text(exc.format_message())}\n")
        sys.exit(exc.exit_code)
    except OnceqError as exc:
        say(redact_text(str(exc)), "error")  # a JSON object when the command logs JSON
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("onceq: interrupted\n")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_line(exc: click.UsageError, unquoted: Iterable[str] = ()) -> str:
    """One line, like every other refusal: `onceq: SUBCOMMAND: problem (see … --help)`.

    click's command path starts with the program's own name (`onceq mq`), which the
    `onceq: ` every error line starts with already says: it is written once.
    """
    path = exc.ctx.command_path if exc.ctx is not None else "onceq"
    sub = path.partition(" ")[2]
    message = redact_text(exc.format_message())  # click may quote a URL argument
    head, _, stray = exc.format_message().rpartition(" (")
    if "extra argument" in head and set(stray.rstrip(")").split()) & set(unquoted):
        # "Got unexpected extra arguments (Bearer T)": a header's value the shell split.
        message = f"{redact_text(head)} ({MASK}){UNQUOTED}"
    where = f"{sub}: " if sub else ""
    return f"onceq: {where}{message} (see {path} --help)\n"
