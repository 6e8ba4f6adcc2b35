"""Load scenario TOML files: parse, run the checks of every key (checks.py) and build the
:class:`Scenario` (scenario.py, which also writes one back as TOML).

Every user mistake becomes one :class:`~racesim.sim.errors.InputError` line of the form
``<source>:<line>: <key>: <problem> (got <value>)``; nothing else escapes parsing. tomllib
gives line numbers only for syntax errors, so semantic errors are located by scanning the text.
"""

from __future__ import annotations
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from racesim.engine_model.config import Workload
from racesim.scenarios.checks import (
    MAX_REQUEST_ID,
    TABLES,
    Bad,
    check_consistent,
    check_corpus,
    check_fits,
    check_plan,
    check_requests,
    check_table,
    check_value,
    input_error,
    key_text,
    show,
)
from racesim.scenarios.limits import MAX_NAME, MAX_REQUESTS, over_limits
from racesim.scenarios.scenario import CorpusInfo, Scenario, scenario_to_toml
from racesim.sim.errors import InputError

__all__ = [
    "CorpusInfo",
    "Scenario",
    "MAX_REQUEST_ID",
    "parse_scenario",
    "scenario_from_dict",
    "scenario_to_toml",
]

_TOP = ("name", "summary", "topology", "frontends", "horizon", *TABLES, "request", "delays",
        "witness", "corpus")


_TOP_KINDS = {"name": "str", "summary": "str", "topology": "str", "frontends": "int",
              "horizon": "float"}


def _build(data: object, source: str) -> Scenario:
    if not isinstance(data, Mapping):
        raise Bad((), "a scenario must be a table of keys", data)
    for key in data:
        if key not in _TOP:
            raise Bad((key_text(key),), f"unknown top-level key (allowed: {', '.join(_TOP)})")
    if "name" not in data:
        raise Bad(("name",), "required key is missing")
    top: dict[str, Any] = {k: check_value(data[k], kind, (k,), k)
                           for k, kind in _TOP_KINDS.items() if k in data}
    if len(top["name"]) > MAX_NAME:
        raise Bad(("name",), f"is {len(top['name'])} characters long, more than racesim's cap "
                  f"of {MAX_NAME} (files are named after it; docs/limits.md)")
    frontends = int(top.get("frontends", 1))
    tables = {k: cls(**check_table(data.get(k, {}), (k,), cls, k)) for k, cls in TABLES.items()}
    horizon = float(top.get("horizon", 30.0))
    workload = Workload(topology=str(top.get("topology", "single")), frontends=frontends,
                        horizon=horizon, requests=check_requests(data.get("request"), frontends,
                                                                 horizon), **tables)
    for path, problem, value in over_limits(workload):
        raise Bad(path, problem, value)
    check_fits(workload)
    check_consistent(workload)
    return Scenario(name=str(top["name"]), summary=str(top.get("summary", "")),
                    workload=workload, delays=check_plan(data.get("delays"), "delays"),
                    witness=check_plan(data.get("witness"), "witness"), source=source,
                    has_witness="witness" in data,
                    corpus=check_corpus(data.get("corpus"),
                                        "witness" in data or "delays" in data))


def _checked(data: object, source: str, text: str | None) -> Scenario:
    try:
        return _build(data, source)
    except Bad as bad:
        raise input_error(source, text, bad) from None
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    except Exception as e:
        raise InputError(f"{source}: invalid scenario: {type(e).__name__}: {show(str(e))}") \
            from None


def scenario_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Scenario:
    """Validate a TOML-shaped dict (as :meth:`Scenario.to_dict` makes) into a Scenario."""
    return _checked(data, source, None)


#: a ``[[request]]`` table header at the start of a line (what the early count looks for)
_REQUEST_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*request[ \t]*\]\]", re.MULTILINE)


def _too_many_requests(text: str, source: str) -> None:
    """Refuse a text with more ``[[request]]`` headers than MAX_REQUESTS before parsing it:
    tomllib on a 10 MB file of 100,001 requests takes seconds and 200 MB, only for the count
    to be refused afterwards. A header-like line inside a multi-line string counts too (a
    file that has more than MAX_REQUESTS of them is refused either way in practice)."""
    if text.count("[[") <= MAX_REQUESTS:
        return
    for n, m in enumerate(_REQUEST_HEADER.finditer(text)):
        if n == MAX_REQUESTS:
            line = text.count("\n", 0, m.start()) + 1
            raise InputError(f"{source}:{line}: request: more than {MAX_REQUESTS} [[request]] "
                             f"entries, racesim's cap (docs/limits.md); not parsed further")


def parse_scenario(text: str, source: str) -> Scenario:
    """Parse and validate scenario TOML text; ``source`` names it in error messages."""
    if not isinstance(text, str):
        raise InputError(f"{source}: scenario text must be a string (got {show(text)})")
    _too_many_requests(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        where = f"{source}:{m.group(1)}" if m else source
        raise InputError(f"{where}: invalid TOML: {e}") from None
    except Exception as e:
        raise InputError(f"{source}: invalid TOML: {show(str(e))}") from None
    return _checked(data, source, text)