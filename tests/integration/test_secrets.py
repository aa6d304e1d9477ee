"""A password in a mistyped URL never reaches stdout or stderr, whatever the typo.

Generated URLs: scheme typos (`amqp//`, `amqp:/`, `amqps//`, none, ...), passwords of
awkward characters (`@ / # ? %40`, spaces, unicode) around tokens that cannot appear
by chance (`ab123XYZ`), with and without port and vhost. Each goes through the
commands that take a URL: in-process for most examples (click's isolation captures
stdout, stderr and the log lines, which the CLI writes to stderr), and through real
`python -m onceq` processes for a handful. A token found in the output is a leak,
whole or in part (the piece of a password after a '/' or '#').

`mq status` reads the broker over AMQP and the management API (never rabbitmqctl since
issue 10); the rabbitmqctl stub on PATH stays so that nothing here can start the real
one, which takes seconds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mq_support import EXERCISE, claim_doc, publish, topology, write_claims
from support import in_process, run_cli

TOKEN = st.from_regex(r"[a-z]{2}[0-9]{3}[A-Z]{3}", fullmatch=True)
AWKWARD = st.lists(
    st.sampled_from(
        [*"@/#?%:;!$&'()*+,=[]~^{}|<>\"\\ .", "%40", "%2F", "é", "€", "中", "🙂", "\t"]
    ),
    max_size=3,
).map("".join)
BROKER_SCHEMES = [
    "amqp//", "amqp:/", "amqps//", "amqp:", "amqp:///", "//", "", "amqp://", "amqps://",
    "ampq://", "amqp;//", "AMQP://", "amqp:\\\\", "http//", "amqp/", "amqp::/",
]  # fmt: skip
CLAIM_SCHEMES = ["http//", "http:/", "https//", "http:", "", "//", "http://", "htp://", "http:///"]
MAX_EXAMPLES = int(os.environ.get("ONCEQ_SECRETS_EXAMPLES", "40"))


@st.composite
def passwords(draw: st.DrawFn) -> tuple[str, list[str]]:
    """(password, its tokens): awkward characters around one to three tokens."""
    parts = draw(st.lists(st.tuples(AWKWARD, TOKEN), min_size=1, max_size=3))
    tail = draw(AWKWARD)
    return "".join(a + t for a, t in parts) + tail, [t for _, t in parts]


Case = tuple[str, str, list[str]]  # url, password, the password's tokens


@st.composite
def mistyped(draw: st.DrawFn, schemes: list[str], ports: list[str]) -> Case:
    password, tokens = draw(passwords())
    user = draw(st.from_regex(r"[a-z][a-z0-9._-]{0,6}", fullmatch=True))
    host = draw(st.sampled_from(["127.0.0.1", "localhost"]))
    port = draw(st.sampled_from(ports))
    vhost = draw(st.sampled_from(["", "/", "/%2F", "/v"]))
    url = f"{draw(st.sampled_from(schemes))}{user}:{password}@{host}{port}{vhost}"
    return url, password, tokens


# Ports: the broker's (a login that is refused), a closed one, and nonsense.
BROKER_URLS = mistyped(BROKER_SCHEMES, ["", ":5672", ":1", ":0", ":99999", ":x"])
CLAIM_URLS = mistyped(CLAIM_SCHEMES, ["", ":1", ":0", ":99999", ":x"])
ISSUE_CASES: list[Case] = [
    ("amqp//alice:s3cr3tAB@127.0.0.1:5672/", "s3cr3tAB", ["s3cr3tAB"]),
    ("amqp:/alice:s3cr3tAB@127.0.0.1:5672/", "s3cr3tAB", ["s3cr3tAB"]),
    ("amqps//alice:s3cr3tAB@127.0.0.1:5672/", "s3cr3tAB", ["s3cr3tAB"]),
    # urlsplit's error quoted 's3q', the piece before the '/', as the port
    ("amqp://alice:s3q/cr3tAB@127.0.0.1/", "s3q/cr3tAB", ["s3q", "cr3tAB"]),
    # passes every check, then fails to connect
    ("amqp://alice:ab cd5XY@127.0.0.1:5672/", "ab cd5XY", ["cd5XY"]),
    # urlsplit takes it, yarl (inside aiormq.connect) raised a bare ValueError: a traceback
    ("amqp://a:aa000AAA\\@127.0.0.1", "aa000AAA\\", ["aa000AAA"]),
    # urlsplit's refusal quoted the bracketed piece: "'ab000AAA' does not appear to be…"
    ("//a:aa000AAAaa000AAA[ab000AAA]@127.0.0.1", "aa000AAAaa000AAA[ab000AAA]", ["ab000AAA"]),
]


def _commands(tmp: Path, claim: str = "http://127.0.0.1:9") -> list[list[str]]:
    return [
        ["mq", "status"],
        ["mq", "topology"],
        ["mq", "publish", str(tmp / "claims" / "c00000.json")],
        [
            "mq",
            "consume",
            "--claim",
            claim,
            "--max-seconds",
            "0.5",
            "--db",
            str(tmp / "l.db"),
            *EXERCISE,
        ],
    ]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A claim file to publish and a rabbitmqctl stub that answers at once."""
    tmp = tmp_path_factory.mktemp("secrets")
    write_claims(tmp / "claims", [claim_doc("g-secret-1")])
    stub = tmp / "bin" / "rabbitmqctl"
    stub.parent.mkdir()
    stub.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in\n'
        "  list_queues) echo '[]'; exit 0;;\n"
        '  status) echo \'{"vm_memory_high_watermark_setting": {"relative": 0.4}}\'; exit 0;;\n'
        "esac; done\n"
        'echo "stub: unexpected $*" >&2; exit 1\n'
    )
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return tmp


def _env(place: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{place / 'bin'}{os.pathsep}{os.environ['PATH']}", **extra}


def assert_no_leak(text: str, password: str, tokens: list[str], what: object) -> None:
    leaked = [t for t in tokens if t in text]
    assert password not in text and not leaked, f"{what}: leaked {leaked}:\n{text}"
    assert "Traceback" not in text, f"{what}:\n{text}"


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=BROKER_URLS, which=st.integers(0, 3), as_json=st.booleans())
@example(case=ISSUE_CASES[0], which=0, as_json=False)
@example(case=ISSUE_CASES[1], which=1, as_json=False)
@example(case=ISSUE_CASES[2], which=2, as_json=True)
@example(case=ISSUE_CASES[3], which=3, as_json=False)
@example(case=ISSUE_CASES[4], which=1, as_json=True)
@example(case=ISSUE_CASES[5], which=3, as_json=False)
@example(case=ISSUE_CASES[6], which=0, as_json=False)
def test_a_mistyped_broker_url_never_shows_its_password(
    place: Path, case: Case, which: int, as_json: bool
) -> None:
    url, password, tokens = case
    args = _commands(place)[which] + (["--json"] if as_json else [])
    _code, text = in_process(args, _env(place, EAI_AMQP_URL=url))
    assert_no_leak(text, password, tokens, (url, args))


@pytest.fixture
def claims_vhost(amqp_url: str, place: Path) -> str:
    """A vhost with the topology and a few claims: a claim URL that passes the checks
    is then really called (and fails), so the handler's errors are shown too."""
    topology(amqp_url)
    publish(amqp_url, *write_claims(place / "more", [claim_doc(f"g-{i}") for i in range(4)]))
    return amqp_url


@pytest.mark.parametrize("which", range(4))
def test_a_backslash_in_the_password_is_a_usage_error(place: Path, which: int) -> None:
    """yarl refuses a backslash before the host where urlsplit does not: every command
    that takes the broker URL refuses it up front, one masked line, exit 2."""
    url, password, tokens = ISSUE_CASES[5]
    code, text = in_process(_commands(place)[which], _env(place, EAI_AMQP_URL=url))
    assert code == 2, text
    assert text.startswith("onceq: EAI_AMQP_URL=amqp://a:***@127.0.0.1: not a valid URL"), text
    assert "backslash" in text
    assert_no_leak(text, password, tokens, url)


@settings(
    max_examples=max(MAX_EXAMPLES // 4, 5),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=CLAIM_URLS, as_json=st.booleans())
@example(case=("http//bob:pwSECRET7@127.0.0.1:9202", "pwSECRET7", ["pwSECRET7"]), as_json=False)
@example(case=("http://bob:pw SECRET7@127.0.0.1:1/", "pw SECRET7", ["SECRET7"]), as_json=True)
# no scheme, a password that starts with '/': the user reads as a scheme `oh35:/`
@example(case=("oh35:/@ab000AAA@@127.0.0.1", "/@ab000AAA@", ["ab000AAA"]), as_json=False)
def test_a_mistyped_claim_url_never_shows_its_password(
    claims_vhost: str, place: Path, case: Case, as_json: bool
) -> None:
    claim, password, tokens = case
    args = _commands(place, claim)[3] + (["--json"] if as_json else [])
    _code, text = in_process(args, _env(place, EAI_AMQP_URL=claims_vhost))
    assert_no_leak(text, password, tokens, (claim, args))


@settings(max_examples=4, deadline=None)
@given(case=BROKER_URLS, which=st.integers(0, 3))
@example(case=ISSUE_CASES[0], which=0)
@example(case=ISSUE_CASES[4], which=3)
def test_a_real_process_never_shows_the_password(place: Path, case: Case, which: int) -> None:
    url, password, tokens = case
    args = _commands(place)[which]
    r = run_cli(*args, env=_env(place, EAI_AMQP_URL=url), timeout=60)
    assert_no_leak(r.stdout + r.stderr, password, tokens, (url, args))
    assert r.returncode in (0, 2, 3, 4, 5, 6, 7, 8), r.stderr


@settings(
    max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=CLAIM_URLS)
@example(case=("http//bob:pwSECRET7@127.0.0.1:9202", "pwSECRET7", ["pwSECRET7"]))
def test_a_real_process_never_shows_the_claim_password(
    claims_vhost: str, place: Path, case: Case
) -> None:
    claim, password, tokens = case
    args = _commands(place, claim)[3]
    r = run_cli(*args, env=_env(place, EAI_AMQP_URL=claims_vhost), timeout=60)
    assert_no_leak(r.stdout + r.stderr, password, tokens, (claim, args))


def test_a_url_as_a_stray_argument_is_masked_in_clicks_usage_error(place: Path) -> None:
    """click's own message quotes the argument: 'Got unexpected extra argument (…)'."""
    code, text = in_process(["mq", "status", "http//bob:pwSECRET7@h"], _env(place))
    assert code == 2 and "extra argument" in text
    assert_no_leak(text, "pwSECRET7", ["pwSECRET7"], "stray argument")


def test_a_ledger_url_that_cannot_be_reached_is_masked(
    claims_vhost: str, place: Path, tmp_path: Path
) -> None:
    """EAI_MQ_DB a PostgreSQL URL whose host does not resolve: exit 8, one masked line
    (issue 9: a postgres:// URL is a shared ledger now, no longer a mistaken path)."""
    env = _env(place, EAI_AMQP_URL=claims_vhost)
    env["EAI_MQ_DB"] = "postgres://app:dbSECRET9@db.example/ledger.db"
    r = run_cli("mq", "consume", "--claim", "http://127.0.0.1:9", *EXERCISE, env=env, cwd=tmp_path)
    assert r.returncode == 8 and "cannot open the ledger" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert_no_leak(r.stdout + r.stderr, "dbSECRET9", ["dbSECRET9"], "EAI_MQ_DB")
    assert list(tmp_path.iterdir()) == []


# The '@' forgotten or mistyped: nothing marks where userinfo ends, so `amqp://alice:pw`
# parses as host alice, port pw. A password that starts with a letter is never a port,
# so every such URL is refused, and the refusal must not show it.
NO_AT = st.lists(
    st.sampled_from([*"/#?%:;!$&'()*+,=[]~^{}|<>\"\\ .", "%2F", "é", "中", "\t"]), max_size=3
).map("".join)


@st.composite
def without_at(draw: st.DrawFn, schemes: list[str]) -> Case:
    token = draw(TOKEN)
    password = token + draw(NO_AT)
    user = draw(st.from_regex(r"[a-z][a-z0-9._-]{0,6}", fullmatch=True))
    sep = draw(st.sampled_from(["", "#", "/", " ", "?"]))
    rest = draw(st.sampled_from(["127.0.0.1:5672/", "localhost", "", "/v"]))
    return f"{draw(st.sampled_from(schemes))}{user}:{password}{sep}{rest}", password, [token]


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=without_at(BROKER_SCHEMES), which=st.integers(0, 3), as_json=st.booleans())
@example(case=("amqp://alice:s3cr3tAB", "s3cr3tAB", ["s3cr3tAB"]), which=0, as_json=False)
@example(case=("amqp//alice:s3cr3tAB", "s3cr3tAB", ["s3cr3tAB"]), which=1, as_json=True)
@example(case=("amqp://alice:s3cr3tAB 127.0.0.1/", "s3cr3tAB", ["s3cr3tAB"]), which=0, as_json=True)
def test_a_broker_url_without_its_at_never_shows_the_password(
    place: Path, case: Case, which: int, as_json: bool
) -> None:
    url, password, tokens = case
    args = _commands(place)[which] + (["--json"] if as_json else [])
    code, text = in_process(args, _env(place, EAI_AMQP_URL=url))
    assert code == 2, (url, text)  # refused before anything is used
    assert_no_leak(text, password, tokens, (url, args))


@settings(max_examples=max(MAX_EXAMPLES // 2, 5), deadline=None)
@given(case=without_at(CLAIM_SCHEMES))
@example(case=("http://bob:pw12XYZ", "pw12XYZ", ["pw12XYZ"]))
def test_a_claim_url_without_its_at_never_shows_the_password(case: Case) -> None:
    from onceq._exercise.claims_0_1_0 import check_claim_url
    from onceq.errors import UsageError

    url, password, tokens = case
    with pytest.raises(UsageError) as refused:
        check_claim_url(url)
    assert_no_leak(str(refused.value), password, tokens, url)


def test_stdout_data_that_looks_like_userinfo_is_printed_as_it_is(tmp_path: Path) -> None:
    """stdout is data: a msg_id `sip:alice@example.com` in --json output, and a --help
    example with the default `guest:guest@`, are printed as they are (a pattern mask
    there would hand a script ids that are not in the ledger, and a help example that
    fails as printed); stderr still gets every mask."""
    import json

    q = tmp_path / "q"
    (q / "inbox").mkdir(parents=True)
    for i, name in enumerate(("a.json", "b.json")):
        doc = {"msg_id": "sip:alice@example.com", "order_no": "ord:7@b", "seq": i + 1, "amount": 1}
        (q / "inbox" / name).write_text(json.dumps(doc))
    assert run_cli("dirq", "init", str(q)).returncode == 0
    assert run_cli("dirq", "consume", str(q)).returncode == 0
    r = run_cli("dirq", "report", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert "sip:alice@example.com" in json.loads(r.stdout)["duplicates"], r.stdout
    r = run_cli("mq", "topology", "--help")
    assert "amqp://guest:guest@127.0.0.1:5672/%2F" in r.stdout, r.stdout
