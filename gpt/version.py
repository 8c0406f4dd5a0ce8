"""The package version, alone in a module so that anything may import it without importing gpt's
entry points (gpt/__init__.py imports the training and sampling commands on use)."""

__version__ = "0.1.0"
