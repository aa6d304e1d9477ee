"""The layers hold: a lower layer never imports a higher one (issue 18, item 1).

The contract is pyproject.toml's [tool.importlinter] (cli > exercise > flows > ops >
sources > effects > ledger > core), checked by import-linter over every import of the
package, those inside functions included. This test is the CI's run of it.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def test_the_layer_contract_is_kept() -> None:
    r = subprocess.run(
        [str(LINT), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in r.stdout, r.stdout


def test_the_contract_names_every_layer_package() -> None:
    """A new package under src/onceq is placed in the layers, not left outside them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    layers = {name.removeprefix("onceq.") for name in contract["layers"]}
    packages = {p.parent.name for p in (ROOT / "src" / "onceq").glob("*/__init__.py")}
    assert packages == layers
