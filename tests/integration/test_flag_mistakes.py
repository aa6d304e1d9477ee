"""The spec and HTTP flags of `dirq consume` / `mq consume`, mistyped as a user would:
each is one line naming the flag, exit 2, before anything is consumed or created.

Each of these was found by trying them: `--success 200` without --url said
"--succe needs --url"; `--id-field ''` and `--success ''` were taken silently (the
orders preset; no status meaning done); `/api/{invoiceId` (unclosed) was sent as it
was; `--id-field a..b` said "message spec: id_field" instead of the flag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_support import invoke
from support import snapshot

URL = "http://127.0.0.1:9/api/invoices"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--success", "200"], "onceq: --success needs --url"),
        (["--duplicate", "409"], "onceq: --duplicate needs --url"),
        (["--header", "A: b"], "onceq: --header needs --url"),
        (["--url", URL, "--success", ""], "onceq: --success: an empty list"),
        (["--url", URL, "--success", "2x0"], "onceq: --success: '2x0' is not an HTTP status"),
        (["--url", URL, "--duplicate", "2xx"], "onceq: --duplicate: 2xx is also in success"),
        (["--url", "http://{host}/x"], "a {field} may stand in the path or query only"),
        (["--url", URL + "/{invoiceId"], "onceq: --url " + URL + "/{invoiceId: a '{' or '}'"),
        (["--url", URL + "/{}"], "{} is not a field (a.b.c)"),
        (["--id-field", ""], "Invalid value for '--id-field': '' names no field"),
        (["--id-field", "x", "--group-field", " "], "Invalid value for '--group-field'"),
        (["--id-field", "a..b"], "onceq: --id-field 'a..b': not a field path (a.b.c)"),
        (["--id-field", "x", "--keep", "a..b"], "onceq: --keep 'a..b': not a field path"),
        (["--flow", "bad name"], "onceq: flow 'bad name': a flow name is 1-64 of"),
        (["--url", URL, "--timeout", "inf"], "onceq: --timeout: inf is not a positive number"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_mistyped_flag_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    q = tmp_path / "q"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"invoiceId": "INV-1", "msg_id": "m"}')
    assert invoke("dirq", "init", str(q), "--from", str(tmp_path / "in")).returncode == 0
    before = snapshot(tmp_path)
    r = invoke("dirq", "consume", str(q), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert r.stdout == ""
    assert snapshot(tmp_path) == before  # nothing consumed, no ledger created


def test_mq_consume_without_claim_or_url_points_to_help() -> None:
    r = invoke("mq", "consume")
    assert r.returncode == 2
    assert r.stderr == (
        "onceq: mq consume: give --claim URL (the claims preset) or --url URL"
        " (your own flow) (see onceq mq consume --help)\n"
    )


def test_claim_with_url_is_refused() -> None:
    r = invoke("mq", "consume", "--claim", "http://127.0.0.1:9", "--url", URL)
    assert r.returncode == 2
    assert r.stderr.startswith("onceq: --claim is the claims preset"), r.stderr


@pytest.mark.parametrize("flag", [["--header", "X-Api-Key: abcSecret1"], ["--success", "200"]])
def test_an_http_flag_beside_claim_is_refused_not_ignored(flag: list[str]) -> None:
    """The claims preset makes its own call: a --header there was never sent."""
    r = invoke("mq", "consume", "--claim", "http://127.0.0.1:9", *flag)
    assert r.returncode == 2
    assert r.stderr == (
        f"onceq: {flag[0]} is for your own flow (--url), not the claims preset (--claim)\n"
    )
