"""effects: see docs/architecture.md."""
