"""Header values are secrets: a bearer token given by flag, in a flow file or through
`${ENV}` never reaches output, a log, the ledger or a traceback — even from a partner
that echoes it in its error body, whole, JSON-escaped, or the token alone.

The partner here is a real HTTP server (a thread of this process); onceq runs as a
real process, except for the traceback, which is provoked in-process.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from support import http_server, run_cli

# A quote and a slash: JSON escapes them, so an echo in JSON is another shape.
TOKEN = 'sk-LIVE"9x/7Qz-hdr'
PIECES = ("sk-LIVE", "7Qz-hdr")  # any of these in the output is a leak
ENV = {"INVOICE_TOKEN": TOKEN}


class _Echo(BaseHTTPRequestHandler):
    """Refuses every call (422), quoting the Authorization header three ways."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization", "")
        token = auth.partition(" ")[2]
        body = json.dumps({"error": f"invalid token {token}", "got": auth}) + f" raw={auth}"
        data = body.encode()
        self.send_response(422)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    with http_server(_Echo) as url:
        yield f"{url}/api/invoices"


def assert_no_secret(text: str, what: object) -> None:
    leaked = [p for p in PIECES if p in text]
    assert not leaked, f"{what}: leaked {leaked}:\n{text}"
    assert "Traceback" not in text, f"{what}:\n{text}"


def _queue(tmp_path: Path) -> Path:
    q = tmp_path / "q"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "inv1.json").write_text('{"invoiceId": "INV-1", "total": 1}')
    assert run_cli("dirq", "init", str(q), "--from", str(tmp_path / "in")).returncode == 0
    return q


def _details(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return "\n".join(str(r) for r in conn.execute("SELECT * FROM failures"))


@pytest.mark.parametrize("as_json", [False, True])
def test_a_flag_header_echoed_by_the_partner_is_masked_everywhere(
    echo: str, tmp_path: Path, as_json: bool
) -> None:
    q = _queue(tmp_path)
    r = run_cli(
        "dirq", "consume", str(q), "--id-field", "invoiceId", "--url", echo,
        "--header", "Authorization: Bearer ${INVOICE_TOKEN}", *(["--json"] if as_json else []),
        env=ENV,
    )  # fmt: skip
    # Its one invoice refused: a batch in which every message failed ends 11.
    assert r.returncode == 11 and list((q / "error").iterdir()), r.stdout + r.stderr
    assert_no_secret(r.stdout + r.stderr, "consume")
    details = _details(q / "ledger.db")
    assert "http-422" in details and "invalid token ***" in details, details
    assert_no_secret(details, "the ledger's failure details")
    report = run_cli("dirq", "report", str(q), "--json")
    assert_no_secret(report.stdout + report.stderr, "report")
    assert_no_secret((q / "error.csv").read_text(), "error.csv")


FLOW_FILE = """\
ledger = "ledger.db"

[flows.invoices]
source = "dirq"
path = "q"
id_field = "invoiceId"

[flows.invoices.http]
url = "{url}"
headers = {{ Authorization = "Bearer ${{INVOICE_TOKEN}}", X-Api-Key = "${{INVOICE_TOKEN}}" }}
"""


def test_a_flow_file_header_is_masked_in_run_and_check(echo: str, tmp_path: Path) -> None:
    _queue(tmp_path)
    flows = tmp_path / "flows.toml"
    flows.write_text(FLOW_FILE.format(url=echo))
    for args in (["check", str(flows)], ["check", str(flows), "--json"]):
        r = run_cli(*args, env=ENV)
        assert r.returncode == 0, r.stderr
        assert_no_secret(r.stdout + r.stderr, args)
    r = run_cli("run", str(flows), "--until-empty", "--json", env=ENV)
    assert r.returncode == 11, r.stderr  # its one invoice refused: every message failed
    assert json.loads(r.stdout)["flows"]["invoices"]["quarantined"] == 1, r.stdout
    assert_no_secret(r.stdout + r.stderr, "run")
    assert_no_secret(_details(tmp_path / "ledger.db"), "the ledger's failure details")
    # A mistake beside the header: `check` lists it, and still shows no header value.
    flows.write_text(FLOW_FILE.format(url=echo) + 'method = "P O S T"\nbogus = 1\n')
    r = run_cli("check", str(flows), env=ENV)
    assert r.returncode == 2 and "flows.invoices.http.bogus: unknown key" in r.stderr, r.stderr
    assert_no_secret(r.stdout + r.stderr, "check with mistakes")


def test_a_traceback_that_quotes_a_header_value_is_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The last line of defence: a bug whose exception quotes the token (the whole
    value, or the token alone) is printed through the masking streams."""
    from onceq._cli.flow_options import header_pairs
    from onceq._core.redact import forget_all, guarded_stdio

    try:
        header_pairs((f"Authorization: Bearer {TOKEN}",))
        with pytest.raises(SystemExit), guarded_stdio():
            print(f"debug: Bearer {TOKEN}")
            raise RuntimeError(f"unexpected answer for token {json.dumps(TOKEN)}")
    finally:
        forget_all()
    out, err = capsys.readouterr()
    assert "RuntimeError" in err
    for piece in PIECES:
        assert piece not in out + err, out + err


def test_check_masks_a_short_password_in_the_partners_url(tmp_path: Path) -> None:
    """stdout masks only remembered passwords of 4+ characters; `check` prints the
    effect's URL, so it masks it where it formats it (`http://bob:pw@…`)."""
    flows = tmp_path / "flows.toml"
    flows.write_text(
        'ledger = "l.db"\n[flows.a]\nsource = "dirq"\npath = "q"\n'
        '[flows.a.http]\nurl = "http://bob:pw@127.0.0.1:9300/api"\n'
    )
    for extra in ([], ["--json"]):
        r = run_cli("check", str(flows), *extra)
        assert r.returncode == 0, r.stderr
        assert "http://bob:***@127.0.0.1:9300/api" in r.stdout and ":pw@" not in r.stdout
