"""DSPy signatures, one per prompt site, seeded from the installed libraries (see
docs/architecture.md)."""
