"""`onceq sample DIR`: the built-in orders and claims, copied out byte for byte, or nothing."""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import invoke
from support import SAMPLE, snapshot


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_sample_copies_the_orders_and_the_claims(tmp_path: Path) -> None:
    dest = tmp_path / "new" / "fixtures"  # missing parents are created
    r = invoke("sample", str(dest))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["claims", "invoices", "orders"]
    assert _tree(dest / "orders") == {p.name: p.read_bytes() for p in SAMPLE.glob("*.json")}
    assert _tree(dest / "claims") == _tree(SAMPLE / "claims")
    assert _tree(dest / "invoices") == _tree(SAMPLE / "invoices")
    assert len(_tree(dest / "orders")) == 20 and len(_tree(dest / "claims")) == 9
    assert len(_tree(dest / "invoices")) == 8
    assert "20 orders" in r.stdout and "9 claims" in r.stdout and "8 invoices" in r.stdout


def test_sample_json_lists_the_files(tmp_path: Path) -> None:
    r = invoke("sample", str(tmp_path / "fx"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(doc) == ["claims", "invoices", "orders"]
    assert all(Path(p).is_file() for files in doc.values() for p in files)
    assert len(doc["orders"]) == 20 and len(doc["claims"]) == 9


def test_an_existing_empty_folder_is_fine(tmp_path: Path) -> None:
    (tmp_path / "fx" / "orders").mkdir(parents=True)
    r = invoke("sample", str(tmp_path / "fx"))
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "fx" / "orders").iterdir())) == 20


def test_an_existing_target_file_refuses_everything(tmp_path: Path) -> None:
    """Exit 4, one line naming the file, and not one byte changed or added."""
    claims = tmp_path / "fx" / "claims"
    claims.mkdir(parents=True)
    (claims / "claim-009-resent-002.json").write_text("a user's edited claim\n")
    before = snapshot(tmp_path)
    touched = [(tmp_path / "fx").stat().st_mtime_ns, claims.stat().st_mtime_ns]
    r = invoke("sample", str(tmp_path / "fx"))
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1
    assert "claim-009-resent-002.json" in r.stderr
    assert snapshot(tmp_path) == before  # no orders/ created, the claim untouched
    # Refused before anything was made: not even created and removed again.
    assert [(tmp_path / "fx").stat().st_mtime_ns, claims.stat().st_mtime_ns] == touched


def test_a_second_run_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    assert invoke("sample", str(tmp_path / "fx")).returncode == 0
    before = snapshot(tmp_path)
    r = invoke("sample", str(tmp_path / "fx"))
    assert r.returncode == 4
    assert snapshot(tmp_path) == before


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "fx").write_text("not a folder")
    before = snapshot(tmp_path)
    r = invoke("sample", str(tmp_path / "fx"))
    assert r.returncode == 4, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    r = invoke("sample", str(tmp_path / "fx" / "sub"))  # a parent that is a file
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_a_failure_half_way_undoes_the_copy(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A target that appears after the check (a race) is refused by O_EXCL, never
    replaced, and what this call wrote before it is removed again."""
    import pytest

    import onceq._exercise.sample as sample
    from onceq.errors import Conflict

    claims = tmp_path / "fx" / "claims"
    claims.mkdir(parents=True)
    (claims / "claim-009-resent-002.json").write_text("theirs\n")  # copied last
    before = snapshot(tmp_path)
    monkeypatch.setattr(sample, "_check_free", lambda targets: None)  # the check misses it
    with pytest.raises(Conflict, match=r"claim-009-resent-002\.json"):
        sample.copy_sample(tmp_path / "fx")
    assert snapshot(tmp_path) == before
