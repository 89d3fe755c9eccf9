"""wanjax's version (a leaf module: what records and reports name)."""

__version__ = "0.1.0"
