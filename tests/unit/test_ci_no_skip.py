"""The CI=true rule: a skip or an xfail fails the run unless explicitly allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CASES = """
import pytest

def test_skips():
    pytest.skip("nothing here")

@pytest.fixture
def gone():
    pytest.skip("a fixture skip")

def test_fixture_skip(gone):
    pass

@pytest.mark.skipif(True, reason="a marker skip")
def test_marker_skip():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

@pytest.mark.allow_skip(reason="explicitly allowed")
def test_allowed():
    pytest.skip("an allowed skip")

@pytest.mark.allow_skip
def test_allowed_without_a_reason():
    pytest.skip("no reason given")

def test_ok():
    pass
"""


def _run(tmp_path: Path, ci: str | None, *files: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ci_no_skip", "-p", "no:cacheprovider",
         "-q", "-rA", "--rootdir", str(tmp_path), *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_under_ci_every_skip_fails_except_an_allowed_one(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    r = _run(tmp_path, "true", "test_cases.py")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    for name in ("test_skips", "test_xfail", "test_allowed_without_a_reason"):
        assert f"FAILED test_cases.py::{name} - skipped under CI=true" in out, out
    for name in ("test_fixture_skip", "test_marker_skip"):
        assert f"ERROR test_cases.py::{name} - skipped under CI=true" in out, out
    assert "an allowed skip" in out and "SKIPPED [1] test_cases.py" in out, out
    assert "PASSED test_cases.py::test_ok" in out, out
    assert "3 failed, 1 passed, 1 skipped, 2 errors" in out, out


def test_under_ci_a_module_skipped_at_collection_fails(tmp_path: Path) -> None:
    (tmp_path / "test_mod.py").write_text(
        'import pytest\npytest.skip("no tool", allow_module_level=True)\n'
    )
    r = _run(tmp_path, "true", "test_mod.py")
    assert r.returncode != 0 and "skipped under CI=true" in r.stdout, r.stdout


def test_outside_ci_a_skip_is_a_skip(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_mod.py").write_text(
        'import pytest\npytest.skip("no tool", allow_module_level=True)\n'
    )
    for ci in (None, "false"):
        r = _run(tmp_path, ci, "test_cases.py", "test_mod.py")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "1 passed, 6 skipped, 1 xfailed" in r.stdout, r.stdout
