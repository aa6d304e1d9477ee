"""An unset `${NAME}` in a flow file is one mistake: one line naming the file, the key's
line, the key and the variable — never a second line about the empty value left in its
place (`flows.X.url: : not an amqp:// or amqps:// URL` was printed under it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceq._flows.file import FlowFileError, load_flows
from pg_cli import in_process

UNSET = "ONCEQ_TEST_UNSET_VAR"

# (the file, the key that names the unset variable, its line)
CASES = [
    (f'ledger = "${{{UNSET}}}"\n[flows.a]\nsource = "dirq"\npath = "q"\n', "ledger", 1),
    (
        f'[metrics]\nhost = "${{{UNSET}}}"\n[flows.a]\nsource = "dirq"\npath = "q"\n',
        "metrics.host",
        2,
    ),
    (
        f'[flows.X]\nsource = "rabbitmq"\nqueue = "inv.in"\nurl = "${{{UNSET}}}"\n',
        "flows.X.url",
        4,
    ),
    (f'[flows.X]\nsource = "rabbitmq"\nqueue = "${{{UNSET}}}"\n', "flows.X.queue", 3),
    (f'[flows.a]\nsource = "dirq"\npath = "${{{UNSET}}}"\n', "flows.a.path", 3),
    (f'[flows.a]\nsource = "${{{UNSET}}}"\npath = "q"\n', "flows.a.source", 2),
    (
        f'[flows.a]\nsource = "dirq"\npath = "q"\nid_field = "${{{UNSET}}}"\n',
        "flows.a.id_field",
        4,
    ),
    (
        f'[flows.a]\nsource = "dirq"\npath = "q"\nkeep = ["total", "${{{UNSET}}}"]\n',
        "flows.a.keep",
        4,
    ),
    (
        f'[flows.a]\nsource = "dirq"\npath = "q"\n[flows.a.http]\nurl = "${{{UNSET}}}"\n',
        "flows.a.http.url",
        5,
    ),
    (
        f'[flows.a]\nsource = "dirq"\npath = "q"\n[flows.a.python]\nfunction = "${{{UNSET}}}"\n',
        "flows.a.python.function",
        5,
    ),
    (
        f'[flows.a]\nsource = "dirq"\npath = "q"\nretry = "${{{UNSET}}}"\n',
        "flows.a.retry",
        4,
    ),
]


@pytest.mark.parametrize(("text", "key", "line"), CASES, ids=[c[1] for c in CASES])
def test_an_unset_variable_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str, line: int
) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    f = tmp_path / "flows.toml"
    f.write_text(text)
    with pytest.raises(FlowFileError) as refused:
        load_flows(f)
    assert refused.value.lines == [
        f"{f}: line {line}: {key}: environment variable {UNSET} is not set"
    ]


def test_two_unset_variables_in_one_key_are_each_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONCEQ_TEST_UNSET_A", raising=False)
    monkeypatch.delenv("ONCEQ_TEST_UNSET_B", raising=False)
    f = tmp_path / "flows.toml"
    f.write_text(
        '[flows.X]\nsource = "rabbitmq"\nqueue = "inv.in"\n'
        'url = "amqp://${ONCEQ_TEST_UNSET_A}@${ONCEQ_TEST_UNSET_B}/"\n'
    )
    with pytest.raises(FlowFileError) as refused:
        load_flows(f)
    assert refused.value.lines == [
        f"{f}: line 4: flows.X.url: environment variable ONCEQ_TEST_UNSET_A is not set",
        f"{f}: line 4: flows.X.url: environment variable ONCEQ_TEST_UNSET_B is not set",
    ]


def test_other_mistakes_of_the_file_are_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the refused key's later check is skipped: a wrong key beside it still counts."""
    monkeypatch.delenv(UNSET, raising=False)
    f = tmp_path / "flows.toml"
    f.write_text(
        f'[flows.X]\nsource = "rabbitmq"\nqueue = "inv.in"\nurl = "${{{UNSET}}}"\nprefetch = 0\n'
    )
    with pytest.raises(FlowFileError) as refused:
        load_flows(f)
    assert refused.value.lines == [
        f"{f}: line 4: flows.X.url: environment variable {UNSET} is not set",
        f"{f}: line 5: flows.X.prefetch: must be 1-65535, not 0",
    ]


def test_check_prints_the_unset_broker_url_once(tmp_path: Path) -> None:
    """The issue's case, as a user meets it: `onceq check` with EAI_AMQP_URL unset."""
    f = tmp_path / "flows.toml"
    f.write_text('[flows.X]\nsource = "rabbitmq"\nqueue = "inv.in"\nurl = "${EAI_AMQP_URL}"\n')
    code, out, err = in_process(["check", str(f)], env={"EAI_AMQP_URL": None})  # type: ignore[dict-item]
    assert (code, out) == (2, "")
    assert err == (
        f"onceq: {f}: line 4: flows.X.url: environment variable EAI_AMQP_URL is not set\n"
    )
