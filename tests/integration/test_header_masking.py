"""A header's value never reaches the output, however the header is mistyped; nor does
the password of the partner's URL.

Generated: `--header` arguments in every shape a hurried user types (`N=V`, `N V`,
`Authorization Bearer T`, no separator, no name, a name that is not one, odd
whitespace, CR/LF, non-ASCII), their values awkward characters around tokens that
cannot appear by chance (`ab123XYZ`); partner URLs mistyped as in test_secrets, with a
password of the same kind. Each goes through every command that takes --header/--url
(`dirq consume`, `mq consume`) and a flow file's `headers`/`url` through `onceq check`
and `onceq run`, in-process (support.in_process: stdout, stderr and the log lines).

A token is letters and digits, which JSON, repr and percent-encoding leave as they
are: a token absent from the output is absent in every escaped shape too
(onceq._core.redact.secret_shapes). A mistyped header is refused (exit 2) with one line that
names the option (or the flow file's key), and changes nothing in the queue's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cli_support import invoke
from onceq._core.redact import forget_all
from support import in_process, snapshot

TOKEN = st.from_regex(r"[a-z]{2}[0-9]{3}[A-Z]{3}", fullmatch=True)
AWKWARD = st.lists(
    st.sampled_from(
        [*" =:;,\"'\\/+%#@?.~", "\t", "\r\n", "é", "中", "🙂", "%40", "Bearer ", "Basic "]
    ),
    max_size=3,
).map("".join)
NAMES = ["X-Api-Key", "Authorization", "x-api-key", "Api-Key"]
NOT_NAMES = ["X Api", "Authorizatión", "X/Key", "X-Api-Key;", "Ключ"]
SCHEMES = ["http://", "http//", "http:/", "https://", "", "//", "htp://", "http:///"]
MAX_EXAMPLES = int(os.environ.get("ONCEQ_SECRETS_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

Secret = tuple[str, list[str]]  # the text, its tokens


@st.composite
def secrets(draw: st.DrawFn) -> Secret:
    parts = draw(st.lists(st.tuples(AWKWARD, TOKEN), min_size=1, max_size=3))
    return "".join(a + t for a, t in parts) + draw(AWKWARD), [t for _, t in parts]


Header = tuple[str, list[str], bool]  # the --header argument, its tokens, must be refused


@st.composite
def flag_headers(draw: st.DrawFn) -> Header:
    value, tokens = draw(secrets())
    name = draw(st.sampled_from(NAMES))
    shape = draw(st.sampled_from(["good", "equals", "blank", "bare", "no-name", "not-a-name"]))
    if shape == "good":
        arg = f"{name}: {value}"
    elif shape == "equals":
        arg = name + draw(st.sampled_from(["=", " = ", "==", "\t="])) + value
    elif shape == "blank":
        arg = name + draw(st.sampled_from([" ", "\t", "  ", " Bearer "])) + value
    elif shape == "bare":  # no shape at all: `abc123` (a ':' would make its head a name)
        arg = value.replace(":", "")
    elif shape == "no-name":
        arg = f"{draw(st.sampled_from([':', ' : ', '::']))}{value}"
    else:
        arg = f"{draw(st.sampled_from(NOT_NAMES))}: {value}"
    # Refused for sure: no NAME ':' at its head (a blank one may still read
    # `X-Api-Key :v…` as a name and a value), or a value no header can carry once the
    # blanks around it are stripped (`X-Api-Key: \tv` is the header `v`).
    refused = (
        shape in ("equals", "no-name", "not-a-name")
        or ":" not in arg
        or any(c in value.strip() for c in "\r\n\t")
    )
    return arg, tokens, refused


@st.composite
def urls(draw: st.DrawFn) -> Secret:
    password, tokens = draw(secrets())
    password = password.replace("\r\n", "").replace("\t", "")  # a URL is one argument
    user = draw(st.from_regex(r"[a-z][a-z0-9._-]{0,6}", fullmatch=True))
    port = draw(st.sampled_from(["", ":1", ":9", ":x", ":0"]))
    return f"{draw(st.sampled_from(SCHEMES))}{user}:{password}@127.0.0.1{port}/api/x", tokens


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory queue: a run that is not refused has nothing to do."""
    tmp = tmp_path_factory.mktemp("headers")
    assert invoke("dirq", "init", str(tmp / "q")).returncode == 0
    return tmp


# A broker that does not answer: an `mq consume` that is not refused ends at once (7).
ENV = {"EAI_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"}


def _assert_masked(text: str, tokens: list[str], what: object) -> None:
    leaked = [t for t in tokens if t in text]
    assert not leaked, f"{what}: leaked {leaked}:\n{text}"
    assert "Traceback" not in text, f"{what}:\n{text}"


def _run(args: list[str], place: Path, refused: bool, names: tuple[str, ...]) -> str:
    before = snapshot(place)
    try:
        code, text = in_process(args, ENV)
    finally:
        forget_all()  # each example remembers its own secrets, as a process would
    if refused:
        assert code == 2, f"{args}: exit {code}:\n{text}"
        lines = [line for line in text.splitlines() if line.strip()]
        assert any(n in line for line in lines for n in names), text
        assert snapshot(place) == before, f"{args}: the queue's folder changed"
    return text


@SETTINGS
@given(
    headers=st.lists(flag_headers(), min_size=1, max_size=3),
    url=urls(),
    which=st.sampled_from(["dirq", "mq"]),
    log_json=st.booleans(),
    unquoted=st.booleans(),
)
@example(
    headers=[("X-Api-Key=abcSecret1", ["abcSecret1"], True)],
    url=("http://127.0.0.1:9300/api/invoices", []),
    which="dirq",
    log_json=False,
    unquoted=False,
)
@example(
    headers=[("Authorization Bearer abcSecret1", ["abcSecret1"], True)],
    url=("http://127.0.0.1:9300/api/invoices", []),
    which="mq",
    log_json=False,
    unquoted=False,
)
@example(
    headers=[("X-Api-Key abcSecret1", ["abcSecret1"], True)],
    url=("http://127.0.0.1:9300/api/invoices", []),
    which="dirq",
    log_json=True,
    unquoted=False,
)
@example(  # the conflict
    headers=[("Authorization: Bearer abcSecret1", ["abcSecret1"], False)],
    url=("http://bob:pwSecret9@127.0.0.1:9300/api/invoices", ["pwSecret9"]),
    which="mq",
    log_json=False,
    unquoted=False,
)
@example(  # unquoted: the shell splits it, click sees `Bearer abcSecret1` as extra arguments
    headers=[("Authorization: Bearer abcSecret1", ["abcSecret1"], False)],
    url=("http://127.0.0.1:9300/api/invoices", []),
    which="dirq",
    log_json=False,
    unquoted=True,
)
def test_a_mistyped_header_or_url_never_shows_a_secret_in_a_consume_command(
    place: Path, headers: list[Header], url: Secret, which: str, log_json: bool, unquoted: bool
) -> None:
    # Unquoted, the shell splits `--header Authorization: Bearer T` into three words.
    split = [arg.split() if unquoted else [arg] for arg, _, _ in headers]
    flags = [a for words in split for a in ("--header", *words)]
    common = ["--id-field", "id", "--url", url[0], *flags, "--retry", "none"]
    if log_json:
        common += ["--log-format", "json"]
    if which == "dirq":
        args = ["dirq", "consume", str(place / "q"), *common]
    else:
        args = ["mq", "consume", "--queue", "h.in", *common, "--until-empty"]
    refused = any(r for _, _, r in headers) or any(len(words) > 1 for words in split)
    text = _run(args, place, refused, ("--header", "--url"))
    _assert_masked(text, [t for _, ts, _ in headers for t in ts] + url[1], args)


def toml(text: str) -> str:
    """A TOML basic string holding `text` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@st.composite
def table_headers(draw: st.DrawFn) -> Header:
    """(`KEY = VALUE` of a flow file's headers table, tokens, refused)."""
    value, tokens = draw(secrets())
    name = draw(st.sampled_from(NAMES))
    shape = draw(st.sampled_from(["good", "value-in-key", "not-a-name"]))
    if shape == "good":
        return f"{toml(name)} = {toml(value)}", tokens, any(c in value for c in "\r\n\t")
    if shape == "value-in-key":  # `"Authorization Bearer T" = ""`, `"X-Api-Key=T" = ""`
        sep = draw(st.sampled_from([" ", "=", ": ", " Bearer "]))
        return f"{toml(name + sep + value)} = {toml('')}", tokens, True
    return f"{toml(draw(st.sampled_from(NOT_NAMES)))} = {toml(value)}", tokens, True


@SETTINGS
@given(
    headers=st.lists(table_headers(), min_size=1, max_size=3, unique_by=lambda h: h[0]),
    url=urls(),
    command=st.sampled_from([["check"], ["check", "--json"], ["run", "--until-empty"]]),
)
@example(headers=[('"Authorization" = "Bearer abcSecret1"', ["abcSecret1"], False)],
         url=("http://bob:pwSecret9@127.0.0.1:9300/api/invoices", ["pwSecret9"]),
         command=["run", "--until-empty"])  # fmt: skip
def test_a_flow_files_headers_and_url_never_show_a_secret_in_check_or_run(
    place: Path, headers: list[Header], url: Secret, command: list[str]
) -> None:
    keys = [h.split(" = ")[0] for h, _, _ in headers]
    if len({k.lower() for k in keys}) < len(keys):
        headers = headers[:1]  # one name twice is a mistake of its own (tested in unit/)
    flows = place / "flows.toml"
    flows.write_text(
        'ledger = "l.db"\n[flows.f]\nsource = "dirq"\npath = "q"\nid_field = "id"\n'
        f"[flows.f.http]\nurl = {toml(url[0])}\n"
        f"headers = {{ {', '.join(h for h, _, _ in headers)} }}\n",
        encoding="utf-8",
    )
    refused = any(r for _, _, r in headers)
    text = _run([command[0], str(flows), *command[1:]], place, refused, ("flows.f.http",))
    _assert_masked(text, [t for _, ts, _ in headers for t in ts] + url[1], command)
