"""The `tensorgen` command: `main` parses and dispatches; each module registers its subcommands."""

from tensorgen.cli.main import main

__all__ = ["main"]
