"""mypy on the package is clean: the CI's pytest run is its type check (issue 18, item 7).

The settings are pyproject.toml's [tool.mypy]: the package's files, unused ignores and
redundant casts reported, untyped bodies checked, and `onceq` (the public API's module)
under the flags of `mypy --strict`.

Run time on the 2-core test machine (shared, loaded): about 11 s with a cold cache
(the first run, or after mypy or the settings change), 0.5 s warm. The cache lives in
the system's temporary directory, one per checkout, so the test never writes into the
checkout.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import onceq

ROOT = Path(__file__).resolve().parents[2]
# What `mypy --strict` turns on besides the package-wide settings (mypy --help).
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "strict_equality",
    "extra_checks",
}


def _cache_dir() -> Path:
    """Outside the checkout, kept between runs (warm), one per checkout (no mixing)."""
    tag = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"onceq-mypy-cache-{tag}"


def test_mypy_finds_no_error_in_the_package() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(_cache_dir()),
         "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 0, f"mypy exit {r.returncode}:\n{out}"
    assert "Success: no issues found" in out, out


def test_the_public_api_modules_are_checked_as_strictly_as_mypy_strict() -> None:
    """The overrides block for the public API keeps every --strict flag (strict itself
    cannot be set per module) and names exactly `onceq`, `onceq.errors` and the private
    modules `onceq.__all__`'s names are defined in; the package-wide ones are set for all
    modules."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["src/onceq"]
    assert all(mypy[k] is True for k in ("warn_unused_ignores", "warn_redundant_casts"))
    assert mypy["check_untyped_defs"] is True
    homes = {"onceq", "onceq.errors", *onceq._LAZY.values()}
    [api] = [o for o in mypy["overrides"] if "onceq" in o["module"]]
    assert set(api["module"]) == homes, set(api["module"]) ^ homes
    assert {k for k, v in api.items() if v is True} >= STRICT_FLAGS, api
    assert api["implicit_reexport"] is False
