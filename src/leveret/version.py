"""The version of leveret (one place, imported without loading the broker)."""

__version__ = "0.1.0"
