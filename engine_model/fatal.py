"""Where the real engine would raise (KeyError, a failed assert), the model raises EngineFatal."""

from __future__ import annotations

__all__ = ["EngineFatal", "checked_del", "checked_get"]


class EngineFatal(Exception):
    """An exception that kills EngineCore in vLLM (the busy loop has no handler for it)."""


def checked_get(table: dict[str, object], key: str, what: str) -> object:
    """``table[key]`` as vLLM writes it: a missing key is a KeyError that kills the engine."""
    try:
        return table[key]
    except KeyError:
        raise EngineFatal(f"KeyError: {key!r} in {what}") from None


def checked_del(table: dict[str, object], key: str, what: str) -> None:
    """``del table[key]`` as vLLM writes it."""
    try:
        del table[key]
    except KeyError:
        raise EngineFatal(f"KeyError: del {what}[{key!r}]") from None
