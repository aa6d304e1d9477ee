"""The `onceq` command: parse, call the library, print, map errors to exit codes.

Heavy modules (rich, aio-pika, aiormq, aiohttp) are imported inside the commands
that need them, so `onceq dirq lag` and `--help` start in a few tens of ms.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import click

from onceq.core.redact import MASK
from onceq.errors import OnceqError, redact_text

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


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="onceq")
def app() -> None:
    """Consume messages effectively once: at-least-once delivery + a dedup ledger.

    \b
    Example:
      onceq demo                       # the built-in sample through a directory queue
      onceq dirq consume ./q           # consume a queue folder into ./q/ledger.db
      onceq mq consume --claim http://127.0.0.1:9202 --max-seconds 30
    """


def _register() -> None:
    from onceq.cli import demo, dirq, lab, ledger_cmd, mq, partner, run, sample, status

    app.add_command(run.run)
    app.add_command(run.check)
    app.add_command(demo.demo)
    app.add_command(dirq.dirq)
    app.add_command(mq.mq)
    app.add_command(ledger_cmd.ledger)
    app.add_command(partner.partner)
    app.add_command(lab.lab)
    app.add_command(sample.sample)
    app.add_command(status.status)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn our errors into one line and an exit code.

    Everything the command writes to stdout/stderr (rich, click, logging, a traceback)
    passes through the URL-password masking: the last line of defence.
    """
    from onceq.core.redact import guarded_stdio

    with guarded_stdio():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    from onceq.cli.flow_options import remember_header_words

    _register()
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
        from onceq.core.logs import say  # a JSON object when the command logs JSON

        say(redact_text(str(exc)), "error")
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
    from onceq.cli.flow_options import UNQUOTED

    path = exc.ctx.command_path if exc.ctx is not None else "onceq"
    sub = path.partition(" ")[2]
    message = redact_text(exc.format_message())  # click may quote a URL argument
    head, _, stray = exc.format_message().rpartition(" (")
    if "extra argument" in head and set(stray.rstrip(")").split()) & set(unquoted):
        # "Got unexpected extra arguments (Bearer T)": a header's value the shell split.
        message = f"{redact_text(head)} ({MASK}){UNQUOTED}"
    where = f"{sub}: " if sub else ""
    return f"onceq: {where}{message} (see {path} --help)\n"
