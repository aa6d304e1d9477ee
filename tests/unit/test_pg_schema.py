"""The PostgreSQL ledger's own rules: its schema and version, the session settings the
guarantee depends on, concurrent creation, and no password in anything it says."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import psycopg
import pytest

from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.pg.schema import VERSION, conninfo
from onceq._ledger.pg.sql import translate
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger
from onceq.errors import LedgerError, LedgerUnavailable, NotFound
from pg_support import ADMIN_URL

pytestmark = pytest.mark.pg


def q(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def with_password(url: str) -> str:
    return url.replace("postgres@", "postgres:s3cr3t@")


def test_placeholders_are_translated_as_sqlite_numbers_them() -> None:
    assert translate("a = ? AND b = ?") == "a = $1 AND b = $2"
    assert translate("(?1,?2,?3,?,?,?)") == "($1,$2,$3,$4,$5,$6)"
    assert translate("x = ?2 AND y = ? AND z = ?1") == "x = $2 AND y = $3 AND z = $1"
    # a ? inside a literal or a quoted name is not a placeholder
    assert translate("""a = '?' AND "b?" = ? AND c = 'it''s ?'""") == (
        """a = '?' AND "b?" = $1 AND c = 'it''s ?'"""
    )


def test_the_tables_live_in_schema_onceq_with_their_version(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        assert ledger.created
    tables = {r[0] for r in q(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname='onceq'")}
    assert {"meta", "messages", "duplicates", "failures", "replays", "dead_ops"} <= tables
    assert q(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname='public'") == []
    assert q(pg_url, "SELECT value FROM onceq.meta WHERE key='schema_version'") == [(str(VERSION),)]


def test_the_sessions_force_what_the_guarantee_needs(pg_url: str) -> None:
    """A database whose default is synchronous_commit=off still gets durable commits."""
    name = pg_url.rsplit("/", 1)[1]
    q(ADMIN_URL, f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    q(ADMIN_URL, f'ALTER DATABASE "{name}" SET search_path = nowhere')
    with open_ledger(pg_url) as ledger:
        for conn in (ledger._write, ledger._read):
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
            assert conn.execute("SHOW search_path").fetchone()[0] == "onceq, public"
            assert conn.execute("SHOW application_name").fetchone()[0] == "onceq"
            assert conn.info.get_parameters().get("keepalives") == "1"


def test_the_url_keeps_its_own_settings() -> None:
    info = conninfo("postgresql://u@h/db?application_name=billing&keepalives=0&connect_timeout=3")
    parsed = psycopg.conninfo.conninfo_to_dict(info)
    assert parsed["application_name"] == "billing"
    assert parsed["keepalives"] == "0"
    assert parsed["connect_timeout"] == "3"
    assert "keepalives_idle" in parsed  # what the URL left out gets onceq's value


def test_a_newer_schema_is_refused_unchanged(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        ledger.commit([_ok("m1")])
    q(pg_url, "UPDATE onceq.meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="newer onceq"):
        open_ledger(pg_url)
    assert q(pg_url, "SELECT value FROM onceq.meta") == [("99",)]
    assert q(pg_url, "SELECT count(*) FROM onceq.messages") == [(1,)]


def test_a_damaged_ledger_is_refused(pg_url: str) -> None:
    open_ledger(pg_url).close()
    q(pg_url, "DROP TABLE onceq.replays")
    with pytest.raises(LedgerError, match=r"damaged ledger.*replays"):
        open_ledger(pg_url, create=False)


def test_an_unreachable_server_is_ledger_unavailable_without_the_password() -> None:
    url = "postgresql://postgres:s3cr3t@127.0.0.1:1/nope?connect_timeout=2"
    with pytest.raises(LedgerUnavailable) as info:
        open_ledger(url)
    assert "s3cr3t" not in str(info.value)
    assert "postgres:***@127.0.0.1:1" in str(info.value)


def test_a_missing_database_is_one_ledger_error_without_the_password(pg_url: str) -> None:
    url = with_password(pg_url) + "_missing"
    with pytest.raises(LedgerError) as info:
        open_ledger(url, create=False)
    assert "s3cr3t" not in str(info.value) and "does not exist" in str(info.value)


def test_path_is_redacted_and_url_is_real(pg_url: str) -> None:
    url = with_password(pg_url)
    with open_ledger(url) as ledger:
        assert ledger.url == url
        assert "s3cr3t" not in ledger.path and "***" in ledger.path
        assert "s3cr3t" not in repr(ledger)


def test_nul_in_an_id_is_refused_alone_and_a_failure_text_is_made_safe(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        bad, good = _ok("a\x00b"), _ok("m2")
        fail = Entry(Delivery(b"{}", "r\x00f", "m\x003"), Kind.REJECTED, Settle.DEAD, "parse")
        fail.detail = "byte \x00 here"
        ledger.commit([bad, good, fail])
        assert (bad.kind, bad.reason) == (Kind.REJECTED, "ledger-refused")
        assert "NUL" in bad.detail
        assert good.kind is Kind.SUCCESS
        dead = {r["msg_id"]: r for r in ledger.dead_letters()}
        assert set(dead) == {"a\\x00b", "m\\x003"}
        assert (
            dead["m\\x003"]["ref"] == "r\\x00f" and dead["m\\x003"]["detail"] == "byte \\x00 here"
        )


def test_two_processes_creating_the_ledger_at_once_both_succeed(pg_url: str) -> None:
    """Started together against an empty database: the advisory lock serialises the
    creation, exactly one says it created the ledger, and both can commit."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from onceq._ledger.sqlite import Entry
        from onceq._ledger.target import open_ledger
        from onceq._exercise.processed_table import PROCESSED_TABLE
        from onceq._core.transport import Delivery, Kind, Settle
        start = float(sys.argv[1])
        while time.time() < start:
            pass
        with open_ledger({pg_url!r}, sql=PROCESSED_TABLE) as led:
            e = Entry(Delivery(b"{{}}", sys.argv[2], sys.argv[2]), Kind.SUCCESS, Settle.ACK)
            led.commit([e])
            print(led.created, e.kind.name)
        """
    )
    import time

    start = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(start), f"m{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    lines = sorted(o[0].strip() for o in outs)
    assert lines == ["False SUCCESS"] * 3 + ["True SUCCESS"]
    assert q(pg_url, "SELECT count(*) FROM onceq.messages") == [(4,)]
    assert q(pg_url, "SELECT count(*) FROM onceq.processed") == [(4,)]


def _ok(msg_id: str) -> Entry:
    d = Delivery(b"{}", f"{msg_id}.json", msg_id, stable_ref=True)
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": {}})


def test_create_false_on_an_empty_database_makes_nothing(pg_url: str) -> None:
    with pytest.raises(NotFound):
        open_ledger(pg_url, create=False)
    assert q(pg_url, "SELECT nspname FROM pg_namespace WHERE nspname = 'onceq'") == []


def test_the_postgresql_tables_have_every_column_of_the_sqlite_schema(pg_url: str) -> None:
    """The two DDLs are kept by hand, one per dialect: a column added to SQLite's schema
    (ledger_db.SCHEMA) and not to PostgreSQL's would break the shared SQL on one kind."""
    from onceq._ledger.db import expected

    open_ledger(pg_url).close()
    have: dict[str, set[str]] = {}
    for table, column in q(
        pg_url,
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'onceq'",
    ):
        have.setdefault(table, set()).add(column)
    for table, columns in expected().items():
        assert columns <= have.get(table, set()), (table, columns - have.get(table, set()))
