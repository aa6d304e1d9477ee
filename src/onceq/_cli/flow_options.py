"""The message-spec and HTTP-effect flags `dirq consume` and `mq consume` share.

Their values become flow keys (onceq._cli.flow_flags) that the flow file's builder
reads (onceq._flows.build), so a flag run and a flow-file run are one code path. No
spec or effect flag at all means the command's exercise preset, exactly as before
flows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import click

from onceq._core.redact import remember_secret
from onceq.errors import UsageError

ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# The flags that make a run generic (not the preset); --flow only names it.
SPEC_FLAGS = ("id_field", "group_field", "seq_field", "keep", "http_url")
HTTP_FLAGS = (
    "method",
    "headers",
    "idempotency_header",
    "success",
    "duplicate",
    "reject",
    "transient",
)


def flow_name_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--flow NAME (default `default`): the one spelling of a flow's name on every command
    that reads or writes one flow's rows (consume, order-check, report, replay)."""
    return click.option(
        "--flow", "flow_name", metavar="NAME", default="default", show_default=True, help=help
    )


def flow_names_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--flow NAME, repeatable (into `names`): the commands that read several flows
    (status, trace); none given means every flow."""
    return click.option("--flow", "names", multiple=True, metavar="NAME", help=help)


def flow_options(*, timeout: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the spec and HTTP flags; `timeout=False` when the command has its own --timeout."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        opts = [
            flow_name_option("The flow's name in the ledger: ids are deduplicated per flow."),
            click.option(
                "--id-field",
                metavar="PATH",
                callback=_path_flag,
                help="The message's id: a field, dotted into nested objects"
                " (e.g. invoiceId, invoice.id). Makes this your own flow.",
            ),
            click.option(
                "--group-field",
                metavar="PATH",
                callback=_path_flag,
                help="A field grouping messages (what order-check checks per group).",
            ),
            click.option(
                "--seq-field",
                metavar="PATH",
                callback=_path_flag,
                help="An integer sequence field within a group (for order-check).",
            ),
            click.option("--keep", metavar="A,B", help="Fields kept in the ledger (as JSON)."),
            click.option(
                "--url",
                "http_url",
                metavar="URL",
                help="POST each message to this URL; {field} placeholders are filled"
                " from the message (URL-encoded), e.g."
                " http://127.0.0.1:9300/api/invoices/{invoiceId}.",
            ),
            click.option("--method", help="HTTP method for --url (default POST)."),
            click.option(
                "--header",
                "headers",
                multiple=True,
                metavar="'NAME: VALUE'",
                help="Extra header for --url (repeatable); VALUE may be ${ENV}, e.g."
                " --header 'Authorization: Bearer ${TOKEN}'. Values are never"
                " printed.",
            ),
            click.option(
                "--idempotency-header",
                metavar="NAME",
                help="Header carrying the message id (default Idempotency-Key).",
            ),
            click.option(
                "--success",
                metavar="LIST",
                help="Statuses meaning done (default 2xx), e.g. 200,201.",
            ),
            click.option(
                "--duplicate",
                metavar="LIST",
                help="Statuses meaning the partner already has it: done, counted as"
                " a partner duplicate (default 409).",
            ),
            click.option(
                "--reject",
                metavar="LIST",
                help="Statuses meaning dead at once (default 4xx; 408, 425, 429 are transient).",
            ),
            click.option(
                "--transient",
                metavar="LIST",
                help="Statuses to retry (default 5xx,408,425,429; unlisted ones too).",
            ),
        ]
        if timeout:
            opts.append(
                click.option(
                    "--timeout",
                    "http_timeout",
                    type=float,
                    default=10.0,
                    show_default=True,
                    help="Seconds per --url call before it is a timeout.",
                )
            )
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


def is_generic(values: dict[str, Any]) -> bool:
    """True when any spec or effect flag was given: the user's own flow, not the preset."""
    return any(values.get(k) for k in SPEC_FLAGS)


def check_http_flags(values: dict[str, Any], *, preset: bool = False) -> None:
    """An HTTP flag without --url (or beside --claim, a preset with its own call) would
    be silently ignored — a --header never sent: refuse it."""
    if values.get("http_url") and not preset:
        return
    for k in HTTP_FLAGS:
        if values.get(k):
            if preset:
                raise UsageError(
                    f"{_flag(k)} is for your own flow (--url), not the claims preset (--claim)"
                )
            raise UsageError(f"{_flag(k)} needs --url")


def _flag(key: str) -> str:
    """The flag a value came from: headers → --header, id_field → --id-field."""
    return "--header" if key == "headers" else "--" + key.replace("_", "-")


def _path_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--id-field/--group-field/--seq-field: an empty one would silently mean the preset."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} names no field")
    return value


UNQUOTED = " (a --header value with spaces is quoted: --header 'NAME: VALUE')"


def header_words(argv: list[str]) -> list[tuple[str, list[str]]]:
    """Each --header's value and the words after it up to the next option."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--header" and i + 1 < len(argv):
            value, rest = argv[i + 1], argv[i + 2 :]
        elif arg.startswith("--header="):
            value, rest = arg[len("--header=") :], argv[i + 1 :]
        else:
            continue
        words = []
        for word in rest:
            if word.startswith("-"):
                break
            words.append(word)
        out.append((value, words))
    return out


def remember_header_words(argv: list[str]) -> list[str]:
    """Remember as secrets the words after an unquoted `--header Authorization: Bearer T`.

    Unquoted, the shell splits it: click takes `Authorization:` as the header and
    reports `Bearer T` as "unexpected extra arguments" (or takes a word as QDIR),
    quoting the token, before any callback could see it. So before click parses: after
    a --header value with nothing after its ':' (or no ':' at all) the words up to the
    next option are remembered. Returns every word after a --header value, for the
    refusal of extra arguments to mask (`Authorization:Bearer T` leaves `T` there).
    """
    after = []
    for value, words in header_words(argv):
        if not value.partition(":")[2].strip():
            for secret in (*words, " ".join(words)):
                if secret:
                    remember_secret(secret)
        after += words
    return after


def header_pairs(headers: tuple[str, ...]) -> dict[str, str]:
    """`--header` values as {NAME: VALUE}, each ${ENV} filled in and remembered as a secret."""
    # start-up time: `onceq --help` loads this module (cli/__init__), not sqlite3
    from onceq._effects.http_headers import parse_header_arg

    out: dict[str, str] = {}
    for h in headers:
        try:
            # A mistyped one is refused showing only its name-ish prefix: the rest of
            # `X-Api-Key=abc…` or `Authorization Bearer abc…` is a secret.
            name, value = parse_header_arg(h)
        except UsageError as exc:
            raise UsageError(f"--{exc}") from None

        def env(match: re.Match[str], name: str = name) -> str:
            if match[1] not in os.environ:
                raise UsageError(f"--header {name}: environment variable {match[1]} is not set")
            return os.environ[match[1]]

        if name in out:  # the second would replace the first without a word
            raise UsageError(f"--header {name}: given twice")
        out[name] = ENV.sub(env, value)
        # A secret from here on: masked in every line this process prints or logs,
        # whatever echoes it (a partner's error body, an exception, a traceback).
        remember_secret(out[name])
    return out
