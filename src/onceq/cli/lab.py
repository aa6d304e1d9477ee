"""`onceq lab …`: the seed exercises' exact file layouts, written over the package."""

from __future__ import annotations

import click


@click.group()
def lab() -> None:
    """Generate the seed exercises' file layouts (thin scripts over onceq)."""
