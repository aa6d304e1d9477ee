"""The NATS source type without a server: its flow-file keys, their checks, its names.

Every mistake is one line naming its key, found by `onceq check` before anything
connects; the source is found by the registry through its object, as every kind is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_support import invoke
from onceq._core.message import MessageSpec
from onceq._flows.file import FlowFileError, load_flows
from onceq._flows.flow import Flow
from onceq._sources import registry
from onceq._sources.nats.names import DEFAULT_URL, ENV_URL, nats_url, subject_problem
from onceq._sources.nats.plugin import NatsSource, nats_of
from onceq._sources.nats.setup import Setup

SPEC = MessageSpec(id_field="id")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flows.toml"
    path.write_text('ledger = "./l.db"\n' + text)
    return path


def test_a_flow_file_names_every_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[flows.inv]\nsource = "nats"\nstream = "INV"\nsubject = "inv.in"\ndurable = "onceq"\n'
        'prefetch = 20\nack_wait = "1m"\nmax_deliver = 50\nmax_ack_pending = 400\n'
        'dead_subject = "inv.dead"\nurl = "nats://127.0.0.1:4222"\nid_field = "invoiceId"\n',
    )
    (flow,) = load_flows(path).flows
    src = flow.source
    assert src == NatsSource(
        "INV",
        "onceq",
        subject="inv.in",
        url="nats://127.0.0.1:4222",
        prefetch=20,
        ack_wait=60.0,
        max_ack_pending=400,
        max_deliver=50,
        dead_subject="inv.dead",
    )
    assert registry.of(src) is registry.named("nats")
    assert nats_of(src) is src and nats_of(object()) is None
    assert flow.kind == "nats"


@pytest.mark.parametrize(
    ("lines", "wanted"),
    [
        ('stream = "A.B"\ndurable = "d"', "flows.f.stream: 'A.B': letters, digits, - and _ only"),
        ('stream = "S"', "flows.f.durable: missing: it is required"),
        ('stream = "S"\ndurable = "d d"', "flows.f.durable: 'd d': letters, digits"),
        ('stream = "S"\ndurable = "d"\nprefetch = 0', "flows.f.prefetch: must be 1-65535, not 0"),
        ('stream = "S"\ndurable = "d"\nack_wait = "5x"', "flows.f.ack_wait:"),
        ('stream = "S"\ndurable = "d"\nsubject = "a..b"', "flows.f.subject: 'a..b': an empty"),
        ('stream = "S"\ndurable = "d"\ndead_subject = "x.*"', "flows.f.dead_subject: 'x.*'"),
        ('stream = "S"\ndurable = "d"\nmax_deliver = 0', "flows.f.max_deliver: must be -1"),
        ('stream = "S"\ndurable = "d"\nurl = "amqp://h"', "flows.f.url"),
        ('stream = "S"\ndurable = "d"\nqueue = "q"', "flows.f.queue: is for a rabbitmq source"),
    ],
)
def test_each_mistake_is_one_line_naming_its_key(tmp_path: Path, lines: str, wanted: str) -> None:
    path = write(tmp_path, f'[flows.f]\nsource = "nats"\nid_field = "id"\n{lines}\n')
    with pytest.raises(FlowFileError) as err:
        load_flows(path)
    assert wanted in str(err.value)


def test_a_key_two_kinds_take_is_one_line_naming_both(tmp_path: Path) -> None:
    path = write(tmp_path, '[flows.f]\nsource = "dirq"\npath = "q"\nprefetch = 5\n')
    with pytest.raises(FlowFileError) as err:
        load_flows(path)
    lines = [line for line in str(err.value).splitlines() if "prefetch" in line]
    assert len(lines) == 1, lines
    assert "flows.f.prefetch: is for a rabbitmq or nats source, not a dirq one" in lines[0]


def test_the_url_password_is_never_shown(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[flows.f]\nsource = "nats"\nstream = "S"\ndurable = "d"\nid_field = "id"\n'
        'url = "http://bob:hunter2@h:4222"\n',
    )
    with pytest.raises(FlowFileError) as err:
        load_flows(path)
    assert "hunter2" not in str(err.value) and "flows.f.url" in str(err.value)


def test_the_python_source_is_validated_like_the_file() -> None:
    with pytest.raises(Exception, match="prefetch must be 1-65535, not 0"):
        Flow("a", NatsSource("S", "d", prefetch=0), SPEC).validate()
    with pytest.raises(Exception, match=r"stream: 'S\.1'"):
        Flow("a", NatsSource("S.1", "d"), SPEC).validate()
    assert Flow("a", NatsSource("S", "d"), SPEC).validate().kind == "nats"


def test_the_server_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    assert nats_url() == DEFAULT_URL
    monkeypatch.setenv(ENV_URL, "nats://10.0.0.1:4333")
    assert nats_url() == "nats://10.0.0.1:4333"
    assert nats_url("nats://h:1") == "nats://h:1"


def test_subjects() -> None:
    assert subject_problem("a.b.c") == ""
    assert subject_problem("a.*.>") == ""
    assert "wildcard" in subject_problem("a.*", wildcards=False)
    assert "last token" in subject_problem("a.>.b")
    assert subject_problem("") and subject_problem("a b") and subject_problem("a.")


def test_setup_names_its_defaults_and_refuses_a_dead_subject_equal_to_the_work_one() -> None:
    spec = Setup("INV", "inv", "onceq")
    assert (spec.dead, spec.dead_stream) == ("onceq.dead.INV", "INV_DEAD")
    assert spec.problems() == []
    assert Setup("INV", "inv", "d", dead_subject="inv").problems() == [
        "dead_subject: must differ from the work subject"
    ]


def test_setup_and_consume_refuse_bad_flags_before_connecting() -> None:
    # ONCEQ_NATS_URL points nowhere: a refusal here never reached a server.
    env = {ENV_URL: "nats://127.0.0.1:1"}
    got = invoke("nats", "setup", "--stream", "S", "--subject", "s", env=env)
    assert got.returncode == 2 and "give --durable" in got.stderr
    got = invoke("nats", "setup", "--stream", "S.x", "--subject", "s", "--durable", "d", env=env)
    assert got.returncode == 2 and "--stream: 'S.x'" in got.stderr
    got = invoke("nats", "publish", "x.json", "--subject", "a.*", env=env)
    assert got.returncode == 2 and "--subject: 'a.*': a wildcard" in got.stderr
    got = invoke("nats", "consume", "--stream", "S", "--durable", "d", env=env)
    assert got.returncode == 2 and "give --url URL" in got.stderr
    got = invoke(
        "nats",
        "consume",
        "--stream",
        "S",
        "--durable",
        "d",
        "--url",
        "http://h:1/x",
        "--retry-delays",
        "5x",
        env=env,
    )
    assert got.returncode == 2 and "--retry-delays" in got.stderr


def test_a_server_that_is_down_is_exit_7_and_its_password_is_masked(tmp_path: Path) -> None:
    env = {ENV_URL: "nats://bob:hunter2@127.0.0.1:1"}
    got = invoke("nats", "setup", "--stream", "S", "--subject", "s", "--durable", "d", env=env)
    assert got.returncode == 7, got.stderr
    assert "cannot connect" in got.stderr and "hunter2" not in got.stderr + got.stdout
