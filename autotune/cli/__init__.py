"""The ``autotune`` command line: the whole command tree (``main``), one module per command
group, and the helpers they share (``common``)."""

from autotune.cli.main import app, main

__all__ = ["app", "main"]
