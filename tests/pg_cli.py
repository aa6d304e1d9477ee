"""Helpers for the PostgreSQL-ledger CLI tests: the CLI in this process, a leak check.

`in_process` runs `onceq ARGS` through its real entry point (the masking streams, the
error mapping) with click's isolation capturing stdout and stderr, which is where the
CLI's log lines go too: a few ms per command, so generated cases stay cheap.
"""

from __future__ import annotations

from cli_support import run_here

SECRET = "s3cretpw"  # trust authentication accepts any password: a perfect leak probe
SECRET_URL = "postgresql://postgres:" + SECRET + "@127.0.0.1:5432/"


def with_secret(url: str) -> str:
    """`url` (a pg_support URL, no password) with the probe password in it."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def in_process(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `onceq ARGS` run in this process."""
    return run_here(args, env)


def assert_no_leak(text: str, secrets: list[str], what: object = "") -> None:
    leaked = [s for s in secrets if s and s in text]
    assert not leaked, f"{what}: leaked {leaked}:\n{text}"
    assert "Traceback" not in text, f"{what}:\n{text}"
