"""A PostgreSQL ledger is named the same way everywhere, and a mistyped one is refused.

No database is needed here: every case is refused before a connection is tried
(exit 2, one line naming the flag, the variable or the flow-file key, the password
masked, nothing created). The runs against a real PostgreSQL are in
test_pg_ledger_cli.py; the generated mistyped URLs in test_pg_secrets.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onceq.errors import UsageError
from pg_cli import assert_no_leak, in_process
from support import SAMPLE, snapshot

PW = "pw7SECRETx"
BAD = [
    # (the URL, why it is refused: a piece of the one line)
    (f"postgresql://app:{PW}@127.0.0.1:x/db", "the port is not 1-65535"),
    (f"postgresql://app:{PW}@127.0.0.1:99999/db", "the port is not 1-65535"),
    (f"postgres://app:{PW} 2@127.0.0.1/db", "unexpected spaces"),
    (f"postgresql://app:{PW}%zz@127.0.0.1/db", "invalid percent-encoded token"),
    (f"postgresql://app:{PW}@127.0.0.1/db?nosuch=1", "invalid URI query parameter"),
    (f"postgresql//app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    (f"postgresql:/app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    (f"PostgreSQL:app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    (f"mysql://app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    # no scheme at all: userinfo makes it a URL, not a file name to print
    (f"//app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    (f"app:{PW}@127.0.0.1/db", "not a ledger path nor a postgresql:// URL"),
    # libpq would split at the first '@' and take the rest for the host (and print it)
    (f"postgresql://app:{PW}@x@127.0.0.1/db", "the password must percent-encode"),
    (f"postgresql://app:{PW}/x@127.0.0.1/db", "the password must percent-encode"),
    (f"postgresql://app:%aa{PW}@127.0.0.1/db", "not UTF-8"),
]


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory queue with the sample in its inbox and one file in error/."""
    from onceq._sources.dirq.queue import DirQueue

    q = tmp_path_factory.mktemp("wiring") / "q"
    DirQueue(q).init(SAMPLE)
    (q / "error" / "x.json").write_text("{")
    return q


def _commands(q: Path, db: str) -> list[list[str]]:
    return [
        ["dirq", "consume", str(q), "--db", db],
        ["dirq", "consume", str(q), "--db", db, "--workers", "2", "--json"],
        ["dirq", "report", str(q), "--db", db],
        ["dirq", "order-check", "--db", db, "--json"],
        ["dirq", "dead", "list", str(q), "--db", db],
        ["dirq", "replay", str(q), "x.json", "--db", db],
        ["dirq", "replay", str(q), "--all", "--db", db],
        ["mq", "consume", "--claim", "http://127.0.0.1:9", "--db", db, "--max-seconds", "1"],
        ["mq", "dead", "list", "--db", db],
        ["mq", "dead", "replay", "--all", "--db", db],
    ]


def _refused_line(code: int, out: str, err: str, flag: str, why: str) -> None:
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"onceq: {flag} "), lines
    assert why in lines[0] and "***" in lines[0], lines
    assert_no_leak(out + err, [PW])


@pytest.mark.parametrize(("url", "why"), BAD)
def test_every_db_flag_refuses_a_mistyped_url_before_anything(
    queue: Path, url: str, why: str
) -> None:
    before = snapshot(queue.parent)
    for args in _commands(queue, url):
        code, out, err = in_process(args)
        _refused_line(code, out, err, "--db", why)
        assert out == "", (args, out)
    assert snapshot(queue.parent) == before  # nothing moved, no ledger made


@pytest.mark.parametrize(("url", "why"), BAD[:3] + BAD[5:6])
def test_eai_mq_db_names_itself_when_mistyped(queue: Path, url: str, why: str) -> None:
    for args in (
        ["mq", "consume", "--claim", "http://127.0.0.1:9", "--max-seconds", "1"],
        ["mq", "dead", "list"],
    ):
        code, out, err = in_process(args, {"EAI_MQ_DB": url})
        _refused_line(code, out, err, "EAI_MQ_DB", why)


def _flow_file(tmp: Path, ledger: str) -> Path:
    (tmp / "q").mkdir(exist_ok=True)
    f = tmp / "flows.toml"
    f.write_text(f'ledger = "{ledger}"\n[flows.a]\nsource = "dirq"\npath = "q"\n')
    return f


@pytest.mark.parametrize(("url", "why"), BAD)
def test_a_flow_files_ledger_url_mistake_is_named_by_its_key(
    tmp_path: Path, url: str, why: str
) -> None:
    f = _flow_file(tmp_path, url.replace(PW, "${LEDGER_PW}"))
    for cmd in ("check", "run"):
        code, out, err = in_process([cmd, str(f)], {"LEDGER_PW": PW})
        assert code == 2, err
        lines = err.strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith(f"onceq: {f}: line 1: ledger: "), lines
        assert why in lines[0], lines
        assert_no_leak(out + err, [PW])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flows.toml", "q"]


def test_check_names_a_pg_ledger_without_its_password(tmp_path: Path) -> None:
    """A URL ledger is taken as it is (never joined to the file's folder) and shown
    masked, on stdout and in --json, with the password from ${ENV} (4+ characters
    are masked anywhere, shorter ones where the URL is formatted)."""
    for pw in (PW, "pw"):
        f = _flow_file(tmp_path, "postgresql://app:${LEDGER_PW}@db.example:5433/app")
        code, out, err = in_process(["check", str(f)], {"LEDGER_PW": pw})
        assert code == 0, err
        assert out.splitlines()[-1].endswith(
            "OK, 1 flow(s), ledger postgresql://app:***@db.example:5433/app"
        ), out
        code, out, err = in_process(["check", str(f), "--json"], {"LEDGER_PW": pw})
        assert json.loads(out)["ledger"] == "postgresql://app:***@db.example:5433/app"
        assert f":{pw}@" not in out + err


def test_a_flow_files_url_ledger_is_kept_a_url() -> None:
    from onceq._flows.file import load_flows

    here = Path(__file__).parent
    f = here / "flows-pg.toml"
    try:
        f.write_text('ledger = "postgres://u@h/d"\n[flows.a]\nsource = "dirq"\npath = "q"\n')
        assert load_flows(f).ledger == "postgres://u@h/d"
        f.write_text('ledger = "sub/l.db"\n[flows.a]\nsource = "dirq"\npath = "q"\n')
        assert load_flows(f).ledger == here / "sub" / "l.db"
    finally:
        f.unlink()


def test_onceq_run_refuses_a_mistyped_url_before_touching_a_source(tmp_path: Path) -> None:
    import onceq

    flow = onceq.Flow("a", onceq.DirSource(tmp_path / "no-such-queue"))
    with pytest.raises(UsageError) as refused:
        onceq.run(flow, ledger=f"postgresql://app:{PW}@127.0.0.1:x/db", until_empty=True)
    assert str(refused.value).startswith("ledger postgresql://app:***@127.0.0.1:x/db: ")
    assert PW not in str(refused.value)


def test_a_url_stays_a_str_and_a_path_a_path() -> None:
    from onceq._ledger.target import as_target

    url = "postgresql://u:p@h:5432/d"
    assert as_target(url) == url and isinstance(as_target(url), str)
    # A percent-encoded '@' in the password is what libpq and the masking both read.
    assert as_target("postgres://u:p%40w%2Fx@h/d") == "postgres://u:p%40w%2Fx@h/d"
    assert as_target("a//b.db") == Path("a/b.db")
    assert as_target(Path("x.db")) == Path("x.db")
    # A path that merely contains a colon or an '@' is a path.
    assert as_target("./l@x:1.db") == Path("l@x:1.db")


@pytest.mark.parametrize(
    "args",
    [
        ["dirq", "consume", "--help"],
        ["dirq", "report", "--help"],
        ["dirq", "order-check", "--help"],
        ["dirq", "dead", "list", "--help"],
        ["dirq", "replay", "--help"],
        ["mq", "consume", "--help"],
        ["mq", "dead", "list", "--help"],
    ],
)
def test_every_db_flag_says_it_takes_a_url(args: list[str]) -> None:
    code, out, _ = in_process(args)
    assert code == 0
    assert "--db PATH|URL" in out and "postgresql://" in out, out
