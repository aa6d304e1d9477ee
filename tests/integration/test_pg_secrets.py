"""A password in a PostgreSQL ledger URL never reaches stdout or stderr, whatever the typo.

Generated URLs, in the style of test_secrets.py (the broker's): scheme typos
(`postgresql//`, `postgres:/`, none, ...), passwords of awkward characters around
tokens that cannot appear by chance, ports that answer, refuse or are nonsense, a
database that exists, one that does not, none. Each goes through the commands that
take a ledger (--db, a flow file's `ledger` with the password from ${ENV}), in this
process for most examples and in real processes for a few. A token in the output is a
leak. The outcome is one of: it ran (a well-formed URL to the test's database, which
trust authentication lets in whatever the password), exit 2 (refused as typed), 3
(no ledger there), 8 (cannot connect) — never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pg_cli import in_process
from pg_support import ADMIN_URL, PG_HOST, PG_PORT, create_database, drop_database
from support import SAMPLE, run_cli

pytestmark = pytest.mark.pg

TOKEN = st.from_regex(r"[a-z]{2}[0-9]{3}[A-Z]{3}", fullmatch=True)
AWKWARD = st.lists(
    st.sampled_from([*"@/#?%:;!$&'()*+,=[]~^{}|<>\"\\ .", "%40", "%2F", "é", "中", "\t"]),
    max_size=3,
).map("".join)
SCHEMES = [
    "postgresql://", "postgres://", "POSTGRESQL://", "postgresql//", "postgresql:/",
    "postgres:", "postgresql:///", "postgresq://", "pg://", "//", "", "postgresql:\\\\",
]  # fmt: skip
PORTS = ["", f":{PG_PORT}", ":1", ":0", ":99999", ":x"]
MAX_EXAMPLES = int(os.environ.get("ONCEQ_SECRETS_EXAMPLES", "40"))
Case = tuple[str, str, list[str]]  # url with ${PW} in place of the password, password, tokens


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A queue folder to name, and a database of the module's own (dropped after)."""
    from onceq._sources.dirq.queue import DirQueue

    tmp = tmp_path_factory.mktemp("pgsecrets")
    DirQueue(tmp / "q").init(SAMPLE)
    return tmp


@pytest.fixture(scope="module")
def dbname() -> str:
    url = create_database()
    yield url.rsplit("/", 1)[1]
    drop_database(url)


@st.composite
def passwords(draw: st.DrawFn) -> tuple[str, list[str]]:
    parts = draw(st.lists(st.tuples(AWKWARD, TOKEN), min_size=1, max_size=3))
    return "".join(a + t for a, t in parts) + draw(AWKWARD), [t for _, t in parts]


@st.composite
def mistyped(draw: st.DrawFn) -> Case:
    password, tokens = draw(passwords())
    user = draw(st.sampled_from(["postgres", "app", "a.b-c"]))
    host = draw(st.sampled_from([PG_HOST, "localhost"]))
    db = draw(st.sampled_from(["", "/", "/DB", "/nosuchdb_x"]))
    url = f"{draw(st.sampled_from(SCHEMES))}{user}:${{PW}}@{host}{draw(st.sampled_from(PORTS))}{db}"
    return url, password, tokens


ISSUE_CASES: list[Case] = [
    # well-formed and reachable: it runs, and still prints no password
    (f"postgresql://postgres:${{PW}}@{PG_HOST}:{PG_PORT}/DB", "s3cretpw", ["s3cretpw"]),
    # no such database: the server's refusal is exit 8, masked
    (f"postgresql://postgres:${{PW}}@{PG_HOST}:{PG_PORT}/nosuchdb_x", "s3cretpw", ["s3cretpw"]),
    # nothing listens on port 1: connection refused
    (f"postgresql://postgres:${{PW}}@{PG_HOST}:1/DB", "s3cretpw", ["s3cretpw"]),
    # libpq quotes the piece it cannot read: "ab cd5XY"
    (f"postgresql://postgres:${{PW}}@{PG_HOST}/DB", "ab cd5XY", ["cd5XY"]),
    # a '/' in the password: urlsplit-style readers cut it into a host and a path
    (f"postgresql://postgres:${{PW}}@{PG_HOST}/DB", "ab1/cd234XYZ", ["cd234XYZ"]),
    # the scheme's '//' forgotten: not a path with a folder to name
    (f"postgresql//postgres:${{PW}}@{PG_HOST}/DB", "pw777ABC", ["pw777ABC"]),
    # the '@' in the password unencoded: libpq splits at the first '@'
    (f"postgresql://postgres:${{PW}}@{PG_HOST}/DB", "ab@cd555EFG", ["cd555EFG"]),
]


def _commands(place: Path, url: str) -> list[list[str]]:
    q = str(place / "q")
    return [
        ["dirq", "report", q, "--db", url],
        ["dirq", "order-check", "--db", url, "--json"],
        ["dirq", "dead", "list", q, "--db", url],
        ["check", str(place / "flows.toml")],
        ["run", str(place / "flows.toml"), "--until-empty", "--json"],
    ]


def _flow_file(place: Path, template: str) -> None:
    """The flow file names the ledger with the password as ${PW} (a secret in the env)."""
    ledger = template.replace("\\", "\\\\").replace('"', '\\"')
    (place / "flows.toml").write_text(
        f'ledger = "{ledger}"\n[flows.a]\nsource = "dirq"\npath = "empty"\nid_field = "id"\n'
    )
    (place / "empty" / "inbox").mkdir(parents=True, exist_ok=True)
    for sub in ("processing", "done", "error"):
        (place / "empty" / sub).mkdir(exist_ok=True)


def _check(code: int, text: str, password: str, tokens: list[str], what: object) -> None:
    leaked = [t for t in tokens if t in text]
    assert password not in text and not leaked, f"{what}: leaked {leaked}:\n{text}"
    assert "Traceback" not in text, f"{what}:\n{text}"
    assert code in (0, 1, 2, 3, 8), (what, code, text)


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=mistyped(), which=st.integers(0, 4))
@example(case=ISSUE_CASES[0], which=0)
@example(case=ISSUE_CASES[0], which=4)
@example(case=ISSUE_CASES[1], which=1)
@example(case=ISSUE_CASES[2], which=2)
@example(case=ISSUE_CASES[3], which=3)
@example(case=ISSUE_CASES[4], which=0)
@example(case=ISSUE_CASES[5], which=4)
@example(case=ISSUE_CASES[6], which=2)
def test_a_mistyped_ledger_url_never_shows_its_password(
    place: Path, dbname: str, case: Case, which: int
) -> None:
    template, password, tokens = case
    template = template.replace("/DB", f"/{dbname}")
    _flow_file(place, template)
    url = template.replace("${PW}", password)
    args = _commands(place, url)[which]
    code, out, err = in_process(args, {"PW": password})
    _check(code, out + err, password, tokens, (url, args))
    if code not in (0, 1):
        assert len(err.strip().splitlines()) >= 1 and err.startswith("onceq: "), err


@settings(max_examples=3, deadline=None)
@given(case=mistyped(), which=st.integers(0, 4))
@example(case=ISSUE_CASES[1], which=0)
@example(case=ISSUE_CASES[0], which=4)
def test_a_real_process_never_shows_the_ledger_password(
    place: Path, dbname: str, case: Case, which: int
) -> None:
    template, password, tokens = case
    template = template.replace("/DB", f"/{dbname}")
    _flow_file(place, template)
    url = template.replace("${PW}", password)
    args = _commands(place, url)[which]
    r = run_cli(*args, env={"PW": password}, timeout=60)
    _check(r.returncode, r.stdout + r.stderr, password, tokens, (url, args))


def test_the_admin_url_has_no_password() -> None:
    """The probe relies on trust authentication: the fixtures' URLs carry no password."""
    assert "@" in ADMIN_URL and ":" not in ADMIN_URL.split("//", 1)[1].split("@", 1)[0]
