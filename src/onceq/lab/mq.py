"""Seed 001's layout under R/eaimw/mq (to be written)."""

from __future__ import annotations

from pathlib import Path


def run(root: Path) -> None:
    raise NotImplementedError
