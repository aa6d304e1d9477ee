"""click's usage errors through the real `onceq` entry point: one line, exit 2, the program
named once (`onceq: mq: No such command 'nope'.`, not `onceq: onceq mq: …`), the
subcommand that refused it, and that subcommand's --help to read."""

from __future__ import annotations

import pytest

from pg_cli import in_process


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["nope"], "onceq: No such command 'nope'. (see onceq --help)"),
        (["mq", "nope"], "onceq: mq: No such command 'nope'. (see onceq mq --help)"),
        (
            ["mq", "dead", "nope"],
            "onceq: mq dead: No such command 'nope'. (see onceq mq dead --help)",
        ),
        (["--nope"], "onceq: No such option '--nope'. (see onceq --help)"),
        (
            ["dirq", "init", "--nope"],
            "onceq: dirq init: No such option '--nope'. (see onceq dirq init --help)",
        ),
        (
            ["dirq", "replay"],
            "onceq: dirq replay: Missing argument 'QDIR'. (see onceq dirq replay --help)",
        ),
        (
            ["mq", "dead", "replay", "--rate", "x"],
            "onceq: mq dead replay: Invalid value for '--rate': 'x' is not a valid float range."
            " (see onceq mq dead replay --help)",
        ),
        (
            ["mq", "consume"],
            "onceq: mq consume: give --claim URL (the claims preset) or --url URL (your own"
            " flow) (see onceq mq consume --help)",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_usage_error_names_the_program_once(args: list[str], line: str) -> None:
    code, out, err = in_process(args)
    assert (code, out) == (2, "")
    assert err == line + "\n"
    assert err.count("onceq:") == 1
