"""Seed 000's layout under R/q (to be written)."""

from __future__ import annotations

from pathlib import Path


def run(root: Path, *, fixtures: Path | None, no_run: bool, as_json: bool) -> None:
    raise NotImplementedError
