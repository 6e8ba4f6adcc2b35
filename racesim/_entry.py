"""The console script: Ctrl-C while racesim is still importing is exit 130, not a traceback."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    try:
        from racesim.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("racesim: interrupted\n")
        sys.exit(130)
    cli_main()
