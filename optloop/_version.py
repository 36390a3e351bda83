"""optloop's version (``pyproject.toml`` says the same): a module of its own, so that a command
prints it without importing the package's API."""

__version__ = "0.1.0"
