"""``python -m racesim``: the same as the ``racesim`` command."""

from racesim.cli import main

main()
