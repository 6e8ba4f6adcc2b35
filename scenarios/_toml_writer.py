"""TOML text helpers for scenarios: a small writer (no third-party dependency) and a key locator.

The writer handles what a scenario needs: top-level scalars, tables of scalars and arrays of
tables. Strings are escaped so that any Unicode text (quotes, backslashes, control characters)
reads back unchanged; floats are written with ``repr`` so they read back bit for bit.

The locator finds the line of a key path, since tomllib reports lines only for syntax errors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["dumps", "locate_key", "toml_key", "toml_string"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r",
                  '"': '\\"', "\\": "\\\\"}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and non-printables escaped."""
    out = ['"']
    for ch in text:
        short = _SHORT_ESCAPES.get(ch)
        if short is not None:
            out.append(short)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(f"\\U{ord(ch):08X}")
    out.append('"')
    return "".join(out)


def toml_key(key: str) -> str:
    """A key as written: bare when TOML allows it, else a quoted string."""
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(float(v))  # 'inf', '-inf', '1e-05', '0.1': all valid TOML floats
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, Mapping):
        inner = ", ".join(f"{toml_key(str(k))} = {_value(x)}" for k, x in v.items()
                          if x is not None)
        return "{" + inner + "}" if inner else "{}"
    if isinstance(v, Sequence):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _is_table_array(v: Any) -> bool:
    return (isinstance(v, Sequence) and not isinstance(v, str) and len(v) > 0
            and all(isinstance(x, Mapping) for x in v))


def _pairs(table: Mapping[str, Any]) -> list[str]:
    return [f"{toml_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]


def dumps(data: Mapping[str, Any]) -> str:
    """TOML text for ``data``: scalars first, then ``[tables]``, then ``[[arrays of tables]]``
    in key order. ``None`` values are left out (TOML has no null)."""
    scalars = {k: v for k, v in data.items()
               if not isinstance(v, Mapping) and not _is_table_array(v)}
    blocks = ["\n".join(_pairs(scalars))] if scalars else []
    for key, value in data.items():
        if isinstance(value, Mapping):
            blocks.append("\n".join([f"[{toml_key(key)}]", *_pairs(value)]))
        elif _is_table_array(value):
            blocks.extend("\n".join([f"[[{toml_key(key)}]]", *_pairs(item)]) for item in value)
    return "\n\n".join(blocks) + "\n"


# --------------------------------------------------------------------------- locating keys

_HEADER = re.compile(r"\s*\[")
_QUOTES = re.compile(r"\"+|'+")


def _structural_lines(text: str) -> list[tuple[int, str]]:
    """``(number, line)`` of the lines that start outside any string and any ``[..]``/``{..}``
    value, so a ``[engine]`` inside a multi-line string or an array never counts as a header."""
    starts, state, depth, i = [True], "", 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            state = "" if state in ('"', "'", "#") else state
            starts.append(state == "" and depth == 0)
        elif state == "":
            if text.startswith(ch * 3, i) and ch in "\"'":
                state, i = ch * 3, i + 3
                continue
            if ch in "\"'#":
                state = ch
            depth = depth + (ch in "[{") - (depth > 0 and ch in "]}")
        elif state in ('"', '"""') and ch == "\\" and text[i + 1:i + 2] not in ("", "\n"):
            i += 2
            continue
        elif state in ('"', "'") and ch == state:
            state = ""
        elif len(state) == 3 and text.startswith(state, i):
            run = _QUOTES.match(text, i)
            state, i = "", i + min(len(run.group()) if run else 3, 5)
            continue
        i += 1
    lines = zip(text.split("\n"), starts, strict=True)
    return [(no + 1, line) for no, (line, ok) in enumerate(lines) if ok]


def _key_re(key: str, brackets: tuple[str, str] | None = None) -> re.Pattern[str]:
    """A line that sets ``key`` (bare, "basic" or 'literal'), or its ``[key]`` header."""
    alts = [re.escape(toml_string(key)), re.escape(f"'{key}'")]
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        alts.append(re.escape(key))
    names = "|".join(alts)
    if brackets is None:
        return re.compile(rf"\s*(?:{names})\s*[=.]")
    left, right = map(re.escape, brackets)
    return re.compile(rf"\s*{left}\s*(?:{names})\s*{right}\s*(?:#|$)")


def _nth(lines: list[tuple[int, str]], pattern: re.Pattern[str], nth: int = 0) -> int | None:
    for idx, (_, line) in enumerate(lines):
        if pattern.match(line):
            if nth == 0:
                return idx
            nth -= 1
    return None


def locate_key(text: str | None, path: tuple[object, ...]) -> int | None:
    """The line a key path refers to: ``request[i].key`` is the ``key =`` line after the i-th
    ``[[request]]``; ``engine.key`` the key after ``[engine]`` (else the header's line);
    top-level keys are looked for before the first header. None when not found."""
    if not text or not path or not isinstance(path[0], str):
        return None
    lines = _structural_lines(text)
    first = _nth(lines, _HEADER)
    top = _nth(lines[:len(lines) if first is None else first], _key_re(path[0]))
    rest = path[1:]
    if rest and isinstance(rest[0], int):
        header = _nth(lines, _key_re(path[0], ("[[", "]]")), rest[0])
        rest = rest[1:]
    else:
        header = _nth(lines, _key_re(path[0], ("[", "]")))
    if header is None:
        return None if top is None else lines[top][0]
    if rest and isinstance(rest[0], str):
        pattern = _key_re(rest[0])
        for no, line in lines[header + 1:]:
            if _HEADER.match(line):
                break
            if pattern.match(line):
                return no
    return lines[header][0]
