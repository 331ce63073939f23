"""The library's version (read by the package and by the saved-model record)."""

__version__ = "0.1.0"
