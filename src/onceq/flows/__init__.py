"""flows: see docs/architecture.md."""
