"""The one exception type for mistakes a user can make (bad scenario, unknown name, bad value)."""

from __future__ import annotations

__all__ = ["InputError", "UndeclaredKind"]


class InputError(ValueError):
    """Bad user input. The message is one line that names the file, key and value at fault.

    The CLI prints it on stderr and exits with status 2; nothing else in racesim raises it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UndeclaredKind(KeyError):
    """A trace event kind that no record class declares (a bug in the emitting code).

    Here rather than beside the records: the compiled trace module cannot subclass KeyError."""
