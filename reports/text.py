"""User-supplied text made safe to show: control characters escaped, length bounded.

Request IDs, scenario names and policy summaries are user input. Raw ESC, BEL, CR or NUL would
reach a terminal (``ESC[2J`` clears it) or sit in an HTML page; bidi overrides would reorder
what a reader sees. Each is shown as a Python-style escape instead (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re
import textwrap

__all__ = ["printable", "clip", "wrap"]

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control (and invisible formatting) character escaped."""
    if keep_newlines:
        return "\n".join(_CONTROL.sub(_escape, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape, text)


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis (labels; event text wraps instead)."""
    return text if len(text) <= n else text[: max(n - 1, 1)] + "…"


def wrap(text: str, width: int) -> tuple[str, ...]:
    """``text`` in lines of at most ``width`` characters, broken between words where it can
    be (a request ID with no space in it is broken where it must)."""
    return tuple(textwrap.wrap(text, width, break_on_hyphens=False)) or ("",)
