"""The loaders raise nothing but ``racesim.sim.InputError`` (one line) on any input at all.

Fuzzed: arbitrary text, valid scenario TOML with bytes deleted, inserted or replaced, TOML
made from random documents over the scenario's own keys, arbitrary Python values given to
``scenario_from_dict``, arbitrary names and paths given to ``load_scenario``, and arbitrary
bytes and JSON documents given to ``read_counterexample``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _profiles  # noqa: F401  (loads the ci/dev/nightly profile before @settings below)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.documents import COUNTEREXAMPLE_FORMAT, read_counterexample
from racesim.scenarios import Scenario, load_scenario, parse_scenario, scenario_from_dict
from racesim.scenarios import scenario_to_toml as to_toml
from racesim.scenarios._toml_writer import dumps
from racesim.scenarios.strategies import scenarios
from racesim.sim import InputError

KEYS = ["name", "summary", "topology", "frontends", "horizon", "engine", "ipc", "frontend", "pd",
        "request", "delays", "witness", "id", "at", "prompt_tokens", "max_tokens", "abort_at",
        "eos_at", "stop_string_at", "disconnect_after_tokens", "n", "num_blocks", "block_size",
        "max_num_seqs", "step_time", "async_scheduling", "latency", "hold_timeout",
        "proxy_ids", "frontend.abort:after_pop", "ipc.input:transit#1", "bogus"]
KEY = st.sampled_from(KEYS) | st.text(max_size=6)
SCALAR = (st.none() | st.booleans() | st.integers() | st.integers(-2**80, 2**80)
          | st.floats() | st.text(max_size=8) | st.sampled_from(["single", "pd", "X", ""])
          | st.binary(max_size=4) | st.just(object()) | st.just(math.inf))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner)
                     | st.dictionaries(KEY, inner, max_size=4) | st.frozensets(st.integers()),
                     max_leaves=12)
DOCUMENT = st.dictionaries(KEY, VALUE, max_size=8)
# What TOML itself can hold: used to write syntactically valid TOML with wrong contents.
TOML_SCALAR = (st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats()
               | st.text(st.characters(exclude_categories=["Cs"]), max_size=8))
TOML_VALUE = st.recursive(TOML_SCALAR, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(KEY, inner, max_size=4), max_leaves=10)
TOML_DOCUMENT = st.dictionaries(KEY.filter(lambda k: "\x00" not in k), TOML_VALUE, max_size=8)


def only_input_errors(call: Callable[[], Any]) -> Any:
    """Call; an InputError is fine (one non-empty line), anything else fails the test."""
    try:
        return call()
    except InputError as exc:
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message, repr(message)
        return None


@given(st.text())
def test_any_text(text: str) -> None:
    only_input_errors(lambda: parse_scenario(text, "<fuzz>"))


@st.composite
def mutated_toml(draw: st.DrawFn) -> str:
    """A valid scenario's TOML with a slice deleted, replaced or inserted."""
    text = to_toml(draw(scenarios(max_requests=3)))
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    junk = draw(st.text(max_size=10) | st.sampled_from(
        ["[", "]]", "=", '"', "\n[[request]]\n", "-1", "nan", "1e999", "true", "'", "\\u0000",
         "#", "[engine]\n", '"frontend.abort:after_pop#x" = 1\n']))
    return text[:start] + junk + text[end:]


@given(mutated_toml())
def test_mutated_scenario_toml(text: str) -> None:
    result = only_input_errors(lambda: parse_scenario(text, "<fuzz>"))
    assert result is None or isinstance(result, Scenario)


@given(TOML_DOCUMENT)
def test_valid_toml_with_wrong_contents(doc: dict[str, Any]) -> None:
    text = only_input_errors(lambda: dumps(doc))
    if text is not None:
        only_input_errors(lambda: parse_scenario(text, "<fuzz>"))


@given(DOCUMENT)
def test_any_dict(doc: dict[Any, Any]) -> None:
    only_input_errors(lambda: scenario_from_dict(doc))


@given(st.data())
def test_a_valid_dict_with_one_value_replaced(data: st.DataObject) -> None:
    doc = data.draw(scenarios(max_requests=2), label="scenario").to_dict()
    table = data.draw(st.sampled_from([doc, doc["engine"], doc["ipc"], doc["request"][0]]))
    key = data.draw(st.sampled_from(sorted(table)) | KEY, label="key")
    table[key] = data.draw(VALUE, label="value")
    only_input_errors(lambda: scenario_from_dict(doc))


@given(st.text(max_size=30) | st.sampled_from(["", ".", "..", "/", "abort-reuse/", "\x00",
                                               "a" * 5000 + ".toml", "/dev/null", "/proc"]))
def test_any_scenario_name_or_path(name: str) -> None:
    only_input_errors(lambda: load_scenario(name))


def _counterexample_fields() -> st.SearchStrategy[dict[str, Any]]:
    """Documents shaped like a counterexample file, with any field possibly wrong."""
    good = {"format": COUNTEREXAMPLE_FORMAT, "scenario": {"name": "x", "request": [{"id": "X"}]},
            "policy": "buggy", "policy_options": {}, "seed": 0,
            "schedule": [{"point": "client.send", "occurrence": 0, "delay": 0.1}],
            "skip": [], "violations": [], "trace_hash": "0" * 64}
    json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                              | st.text(max_size=6),
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                              max_leaves=8)
    fields = st.fixed_dictionaries({}, optional={k: st.just(v) | json_value
                                                 for k, v in good.items()})
    return fields


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=64) | _counterexample_fields().map(
    lambda d: json.dumps(d).encode()) | st.sampled_from([b"[]", b"{}", b"null", b"\xff\xfe",
                                                         b'{"format": NaN}', b"[" * 5000]))
def test_any_counterexample_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cx.json"
    path.write_bytes(content)
    only_input_errors(lambda: read_counterexample(str(path)))


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000,
                                     b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_a_counterexample_nested_past_the_recursion_limit(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match="not a JSON counterexample"):
        read_counterexample(str(path))
