"""The package version, recorded with every tuning record."""

__version__ = "0.1.0"
