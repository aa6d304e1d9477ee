"""`onceq nats publish` against the real server: each message stored before it counts.

Its id travels as Nats-Msg-Id: a second copy inside the duplicate window is dropped by
the stream and reported as a duplicate, not an error. The refusals are `mq publish`'s:
one bad file publishes nothing (exit 5); a subject no stream takes is exit 6.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nats_support import Names, consumer_state, nats_names_fixture, setup  # noqa: F401
from support import SAMPLE, run_cli

INVOICES = SAMPLE / "invoices"


def cli(names: Names, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("nats", *args, env={"ONCEQ_NATS_URL": names.url}, timeout=60)


def files(pattern: str) -> list[str]:
    return [str(p) for p in sorted(INVOICES.glob(pattern))]


def test_each_is_stored_once_and_a_resent_id_is_a_duplicate(nats_names: Names) -> None:
    setup(nats_names)
    args = ["--subject", nats_names.subject, "--id-field", "invoiceId", "--json"]
    r = cli(nats_names, "publish", *files("inv-00[1-7]*.json"), *args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["published"] == 6 and out["unroutable"] == [] and out["failed"] == []
    assert [Path(p).name for p in out["duplicates"]] == ["inv-004-resent-001.json"]
    assert consumer_state(nats_names)["stored"] == 6
    # Again: every one a duplicate inside the window, nothing stored twice, exit 0.
    r = cli(nats_names, "publish", *files("inv-00[1-7]*.json"), *args)
    assert r.returncode == 0 and json.loads(r.stdout)["published"] == 0
    assert consumer_state(nats_names)["stored"] == 6


def test_one_bad_file_publishes_nothing(nats_names: Names, tmp_path: Path) -> None:
    setup(nats_names)
    long_id = tmp_path / "long.json"
    long_id.write_text(json.dumps({"invoiceId": "x" * 300}))
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"invoiceId": "INV\n9"}))
    broken = tmp_path / "broken.json"
    broken.write_text('{"invoiceId": ')
    for bad, why in (
        (files("inv-008*.json")[0], "no invoiceId"),
        (str(long_id), "is 300 bytes"),
        (str(control), "control character"),
        (str(broken), "not JSON"),
    ):
        r = cli(
            nats_names, "publish", files("inv-001.json")[0], bad,
            "--subject", nats_names.subject, "--id-field", "invoiceId",
        )  # fmt: skip
        assert r.returncode == 5, (bad, r.stderr)
        assert why in r.stderr and "nothing was published" in r.stderr
        assert r.stderr.count("\n") == 1
    assert consumer_state(nats_names)["stored"] == 0


def test_a_subject_no_stream_takes_is_exit_6_with_the_counts(nats_names: Names) -> None:
    setup(nats_names)
    r = cli(
        nats_names, "publish", *files("inv-00[1-2].json"),
        "--subject", nats_names.subject + ".nowhere", "--id-field", "invoiceId", "--json",
    )  # fmt: skip
    assert r.returncode == 6, r.stderr
    assert "taken by no stream" in r.stderr
    assert json.loads(r.stdout)["published"] == 0
    r = cli(nats_names, "publish", *files("inv-001.json"), "--subject", "a.>")
    assert r.returncode == 2 and "wildcard" in r.stderr
