"""exercise: see docs/architecture.md."""
