"""Argus: what every part shares — the CLI, configuration, the wire protocol and the table definitions."""

__version__ = "0.1.0"

__all__ = ["__version__"]
