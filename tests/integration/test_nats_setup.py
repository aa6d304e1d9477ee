"""`onceq nats setup` against the real server: it creates, it checks, it never changes.

A stream or consumer that exists with another setting is one line naming the setting,
exit 4, and stays as it was.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from nats_support import Names, consumer_state, nats_names_fixture  # noqa: F401
from support import run_cli


def cli(names: Names, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("nats", *args, env={"ONCEQ_NATS_URL": names.url}, timeout=60)


async def _consumer_config(names: Names) -> Any:
    import nats

    nc = await nats.connect(names.url)
    try:
        return (await nc.jetstream().consumer_info(names.stream, names.durable)).config
    finally:
        await nc.close()


def test_it_creates_then_checks_and_a_different_setting_is_exit_4(nats_names: Names) -> None:
    r = cli(nats_names, "setup", *nats_names.setup_args(), "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout).values()) == {"created"}
    r = cli(nats_names, "setup", *nats_names.setup_args(), "--json")
    assert r.returncode == 0 and set(json.loads(r.stdout).values()) == {"exists"}
    config = asyncio.run(_consumer_config(nats_names))
    assert (config.ack_wait, config.max_ack_pending, config.max_deliver) == (30.0, 1000, -1)
    assert getattr(config.ack_policy, "value", config.ack_policy) == "explicit"
    assert config.deliver_subject is None

    r = cli(nats_names, "setup", *nats_names.setup_args(), "--ack-wait", "10")
    assert r.returncode == 4
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ack_wait 30.0, not 10.0" in lines[0] and "not changed" in lines[0]
    assert asyncio.run(_consumer_config(nats_names)).ack_wait == 30.0

    # The stream's own settings are checked too: another subject is a conflict.
    args = ["--stream", nats_names.stream, "--subject", "other.subject", "--durable", "x"]
    r = cli(nats_names, "setup", *args)
    assert r.returncode == 4 and "stream" in r.stderr and "subjects" in r.stderr
    assert consumer_state(nats_names)["stored"] == 0


def test_from_a_flow_file(nats_names: Names, tmp_path: Path) -> None:
    flows = tmp_path / "flows.toml"
    flows.write_text(
        'ledger = "./l.db"\n[flows.inv]\nsource = "nats"\n'
        f'stream = "{nats_names.stream}"\nsubject = "{nats_names.subject}"\n'
        f'durable = "{nats_names.durable}"\nack_wait = "45s"\nid_field = "invoiceId"\n'
    )
    r = cli(nats_names, "setup", "--flows", str(flows))
    assert r.returncode == 0, r.stderr
    assert f"consumer {nats_names.durable}: created" in r.stdout
    assert asyncio.run(_consumer_config(nats_names)).ack_wait == 45.0
    r = cli(nats_names, "setup", "--flows", str(flows), "--stream", "X")
    assert r.returncode == 2 and "--flows" in r.stderr
    # `onceq status` reads the consumer's depths through the source type.
    env = {"ONCEQ_NATS_URL": nats_names.url}
    r = run_cli("status", str(flows), "--json", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    queue = json.loads(r.stdout)["flows"]["inv"]["queue"]
    assert (queue["kind"], queue["pending"], queue["ack_pending"], queue["dead"]) == (
        "nats", 0, 0, 0,
    )  # fmt: skip
    r = run_cli("status", str(flows), env=env, timeout=60)
    assert r.returncode == 0 and "ready 0/0  dead 0" in r.stdout, r.stderr
