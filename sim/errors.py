"""The one exception type for mistakes a user can make (bad scenario, unknown name, bad value)."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Bad user input. The message is one line that names the file, key and value at fault.

    The CLI prints it on stderr and exits with status 2; nothing else in racesim raises it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
