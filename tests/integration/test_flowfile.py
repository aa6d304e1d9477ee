"""A flow file with mistakes: one line each naming the key (and its line), exit 2, and
nothing consumed — the inbox unchanged, no ledger created, the broker queue's depth
unchanged. `onceq check` and `onceq run` refuse alike, before anything is opened."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_support import invoke
from mq_support import cli, queues, topology
from onceq._sources import registry
from support import SAMPLE

GOOD = """\
ledger = "./ledger.db"

[flows.invoices]
source = "dirq"
path = "./q"
id_field = "invoiceId"
keep = ["customer", "total"]

[flows.invoices.http]
url = "http://127.0.0.1:9/api/invoices"
"""


def _queue(tmp: Path) -> Path:
    q = tmp / "q"
    r = invoke("dirq", "init", str(q), "--from", str(SAMPLE / "invoices"))
    assert r.returncode == 0, r.stderr
    return q


def _refused(tmp: Path, text: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Both commands refuse the file (exit 2) and change nothing; the mistake lines."""
    q = _queue(tmp)
    before = sorted(p.name for p in (q / "inbox").iterdir())
    f = tmp / "flows.toml"
    f.write_text(text)
    lines = []
    for cmd in (["check", str(f)], ["run", str(f), "--until-empty", *args]):
        r = invoke(*cmd, env=env)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        lines = r.stderr.splitlines()
        assert all(line.startswith(f"onceq: {f}: ") for line in lines), lines
    assert sorted(p.name for p in (q / "inbox").iterdir()) == before
    assert not (tmp / "ledger.db").exists()
    return lines


def test_a_good_file_checks_ok_and_creates_nothing(tmp_path: Path) -> None:
    _queue(tmp_path)
    f = tmp_path / "flows.toml"
    f.write_text(GOOD)
    r = invoke("check", str(f))
    assert r.returncode == 0, r.stderr
    assert "flow invoices: dirq -> POST http://127.0.0.1:9/api/invoices" in r.stdout
    assert not (tmp_path / "ledger.db").exists()


def test_an_unknown_key_is_named_with_its_line(tmp_path: Path) -> None:
    text = GOOD.replace('keep = ["customer", "total"]', 'keep = ["customer"]\ncolour = "red"')
    lines = _refused(tmp_path, text)
    assert lines == [
        f"onceq: {tmp_path / 'flows.toml'}: line 8: flows.invoices.colour: unknown key"
    ]


def test_a_wrong_type_is_named(tmp_path: Path) -> None:
    lines = _refused(tmp_path, GOOD.replace('keep = ["customer", "total"]', 'keep = "total"'))
    assert len(lines) == 1
    assert "line 7: flows.invoices.keep: must be a list, not text" in lines[0]


def test_a_missing_url_is_named(tmp_path: Path) -> None:
    lines = _refused(tmp_path, GOOD.replace('url = "http://127.0.0.1:9/api/invoices"\n', ""))
    assert len(lines) == 1
    assert "line 9: flows.invoices.http.url: missing" in lines[0]


def test_a_bad_status_list_names_the_item(tmp_path: Path) -> None:
    lines = _refused(tmp_path, GOOD + 'reject = ["4xx", "4x9"]\n')
    assert len(lines) == 1
    assert "line 11: flows.invoices.http.reject: '4x9' is not an HTTP status" in lines[0]


def test_an_unknown_flow_in_run_is_refused(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    f = tmp_path / "flows.toml"
    f.write_text(GOOD)
    r = invoke("run", str(f), "--flow", "invoces", "--until-empty")
    assert r.returncode == 2
    assert r.stderr == f"onceq: {f}: flows: no flow named 'invoces' (the file has: invoices)\n"
    assert len(list((q / "inbox").iterdir())) == 8
    assert not (tmp_path / "ledger.db").exists()


def test_a_missing_environment_variable_is_named_never_shown(tmp_path: Path) -> None:
    text = GOOD + 'headers = { Authorization = "Bearer ${ONCEQ_TEST_NO_SUCH_TOKEN}" }\n'
    lines = _refused(tmp_path, text)
    assert len(lines) == 1
    assert (
        "line 11: flows.invoices.http.headers.Authorization: environment variable"
        " ONCEQ_TEST_NO_SUCH_TOKEN is not set"
    ) in lines[0]


def test_every_mistake_is_one_line_of_its_own(tmp_path: Path) -> None:
    text = (
        GOOD.replace('source = "dirq"', 'source = "dirq"\nworkers = "two"')
        + 'duplicate = [409, 1000]\n\n[flows.b]\nsource = "kafka"\n'
    )
    lines = _refused(tmp_path, text)
    assert len(lines) == 3, lines
    assert any("flows.invoices.workers: must be an integer, not text" in x for x in lines)
    assert any("flows.invoices.http.duplicate: '1000'" in x for x in lines)
    # Every kind the registry knows is named, whatever kinds are registered.
    kinds = registry.kinds()
    named = '", "'.join(kinds[:-1]) + f'" or "{kinds[-1]}'
    assert any(f"flows.b.source: must be \"{named}\", not 'kafka'" in x for x in lines), lines


def test_a_toml_syntax_error_has_its_line(tmp_path: Path) -> None:
    lines = _refused(tmp_path, GOOD + "oops = \n")
    assert len(lines) == 1 and "line 11: not TOML" in lines[0]


def test_a_bad_function_string_is_named(tmp_path: Path) -> None:
    text = GOOD.split("[flows.invoices.http]")[0] + '[flows.invoices.python]\nfunction = "nomod"\n'
    lines = _refused(tmp_path, text)
    assert len(lines) == 1 and "flows.invoices.python.function: 'nomod'" in lines[0]


def test_a_refused_rabbitmq_flow_leaves_the_queue_as_it_was(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    for i in range(3):
        (tmp_path / f"c{i}.json").write_text(f'{{"guid": "g-{i}", "claimId": "C"}}')
    r = cli(amqp_url, "mq", "publish", *(str(tmp_path / f"c{i}.json") for i in range(3)))
    assert r.returncode == 0, r.stderr
    before = queues(amqp_url)
    text = (
        'ledger = "./ledger.db"\n[flows.claims]\nsource = "rabbitmq"\nqueue = "claim.in"\n'
        'prefetch = 0\n[flows.claims.http]\nurl = "http://127.0.0.1:9/x"\n'
    )
    lines = _refused(tmp_path, text, env={"EAI_AMQP_URL": amqp_url})
    assert len(lines) == 1 and "line 5: flows.claims.prefetch: must be 1-65535" in lines[0]
    assert queues(amqp_url) == before
    shutil.rmtree(tmp_path / "q")


@pytest.mark.parametrize("bad", ['ledger = 3\n[flows.a]\nsource = "dirq"\npath = "q"\n'])
def test_top_level_mistakes(tmp_path: Path, bad: str) -> None:
    lines = _refused(tmp_path, bad)
    why = "must be a path or a postgresql:// URL (text)"
    assert lines == [f"onceq: {tmp_path / 'flows.toml'}: line 1: ledger: {why}"]


def test_the_flow_file_in_check_help_is_one_that_check_accepts(tmp_path: Path) -> None:
    """`onceq check --help` shows a flow file: copied as printed, it checks OK (with its
    ${ENV} set), and without the variable it is refused naming the header's key."""
    import textwrap

    r = invoke("check", "--help")
    example = r.stdout.split("Example (flows.toml):\n", 1)[1].split("\n\n", 1)[0]
    (tmp_path / "flows.toml").write_text(textwrap.dedent(example) + "\n")
    ok = invoke("check", str(tmp_path / "flows.toml"), env={"INVOICE_API_KEY": "k3y-VALUE"})
    assert ok.returncode == 0, ok.stderr
    assert "flow invoices: dirq -> POST http://127.0.0.1:9300/api/invoices" in ok.stdout
    assert "k3y-VALUE" not in ok.stdout + ok.stderr
    # and `onceq run --help` sends a newcomer there
    assert "`onceq check --help` shows one" in " ".join(invoke("run", "--help").stdout.split())
    unset = invoke("check", str(tmp_path / "flows.toml"))
    assert unset.returncode == 2
    assert "flows.invoices.http.headers.X-Api-Key: environment variable INVOICE_API_KEY" in (
        unset.stderr
    )


def test_a_bad_flow_name_is_named_with_its_tables_line(tmp_path: Path) -> None:
    """`[flows."bad name"]`: the mistake is about the table itself, so its line is the
    table's header (it had none: the lookup only tried the key's parents)."""
    (tmp_path / "f.toml").write_text(
        'ledger = "l.db"\n\n[flows."bad name"]\nsource = "dirq"\npath = "q"\n'
    )
    r = invoke("check", str(tmp_path / "f.toml"))
    assert r.returncode == 2
    assert r.stderr == (
        f"onceq: {tmp_path / 'f.toml'}: line 3: flows.bad name: a flow name is 1-64 of"
        " A-Z a-z 0-9 _ . - (starting with a letter or digit)\n"
    )
