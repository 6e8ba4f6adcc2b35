"""Every scenario key's check and its one-line error (scenarios/checks.py): a bad value names
the file, line, key and value; unknown keys name what is allowed; nothing else escapes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from _scenario_text import BASE, base_dict, error_of, mutate
from racesim.scenarios import loader, parse_scenario, scenario_from_dict
from racesim.sim.errors import InputError


# --------------------------------------------------------------------------- validation

VALUE_CASES = [
    # (line in BASE, replacement, key named in the message, problem fragment)
    ("horizon = 10.0", "horizon = 0", "horizon", "> 0"),
    ("horizon = 10.0", "horizon = -1.0", "horizon", "> 0"),
    ("horizon = 10.0", "horizon = inf", "horizon", "finite"),
    ("horizon = 10.0", "horizon = nan", "horizon", "finite"),
    ("horizon = 10.0", 'horizon = "10"', "horizon", "number"),
    ("horizon = 10.0", "horizon = true", "horizon", "number"),
    ("frontends = 2", "frontends = 0", "frontends", ">= 1"),
    ("frontends = 2", "frontends = 2.0", "frontends", "integer"),
    ("frontends = 2", "frontends = true", "frontends", "integer"),
    ('topology = "single"', 'topology = "ring"', "topology", "one of"),
    ('name = "base"', "name = 5", "name", "string"),
    ('name = "base"', "name = {a = 1}", "name", "string"),
    ('summary = "s"', 'summary = ["s"]', "summary", "string"),
    ("num_blocks = 64", "num_blocks = 0", "engine.num_blocks", ">= 1"),
    ("num_blocks = 64", "num_blocks = -3", "engine.num_blocks", ">= 1"),
    ("num_blocks = 64", "num_blocks = 1.5", "engine.num_blocks", "integer"),
    ("num_blocks = 64", "num_blocks = true", "engine.num_blocks", "integer"),
    ("num_blocks = 64", 'num_blocks = "64"', "engine.num_blocks", "integer"),
    ("num_blocks = 64", "num_blocks = 99999999999999999999", "engine.num_blocks", "range"),
    ("num_blocks = 64", "num_blocks = [1, 2]", "engine.num_blocks", "integer"),
    ("block_size = 16", "block_size = 0", "engine.block_size", ">= 1"),
    ("max_num_seqs = 16", "max_num_seqs = 0", "engine.max_num_seqs", ">= 1"),
    ("max_num_batched_tokens = 2048", "max_num_batched_tokens = 0",
     "engine.max_num_batched_tokens", ">= 1"),
    ("step_time = 0.01", "step_time = 0", "engine.step_time", "> 0"),
    ("step_time = 0.01", "step_time = -0.01", "engine.step_time", "> 0"),
    ("step_time = 0.01", "step_time = inf", "engine.step_time", "finite"),
    ("step_time = 0.01", "step_time.x = 1", "engine.step_time", "number"),
    ("async_scheduling = false", "async_scheduling = 0", "engine.async_scheduling", "true or"),
    ("latency = 0.0005", "latency = -1", "ipc.latency", ">= 0"),
    ("output_chunk_size = 128", "output_chunk_size = 0", "frontend.output_chunk_size", ">= 1"),
    ("transfer_time = 0.002", "transfer_time = -0.002", "pd.transfer_time", ">= 0"),
    ("hold_timeout = 480.0", "hold_timeout = -inf", "pd.hold_timeout", "finite"),
    ('proxy_ids = "client"', 'proxy_ids = "random"', "pd.proxy_ids", "'client', 'uuid'"),
    ('id = "A"', 'id = ""', "request[0].id", "non-empty"),
    ('id = "A"', "id = 3", "request[0].id", "string"),
    ("at = 0.0", "at = -1.0", "request[0].at", ">= 0"),
    ("prompt_tokens = 32", "prompt_tokens = 0", "request[0].prompt_tokens", ">= 1"),
    ("max_tokens = 40", "max_tokens = 0", "request[0].max_tokens", ">= 1"),
    ("max_tokens = 40", 'prompt = "#2"', "request[0].prompt", "'#'"),
    ("max_tokens = 40", 'prompt = ""', "request[0].prompt", "non-empty"),
    ("max_tokens = 40", "prompt = 1", "request[0].prompt", "string"),
    ("async_scheduling = false", "prefix_caching = 1", "engine.prefix_caching", "true or"),
    ("abort_at = 1.0", "abort_at = 0.25", "request[1].abort_at", ">= at"),
    ("abort_at = 1.0", "abort_at = -1.0", "request[1].abort_at", ">= 0"),
    ("eos_at = 4", "eos_at = 0", "request[1].eos_at", ">= 1"),
    ("stop_string_at = 3", "stop_string_at = 0", "request[1].stop_string_at", ">= 1"),
    ("disconnect_after_tokens = 2", "disconnect_after_tokens = 0",
     "request[1].disconnect_after_tokens", ">= 1"),
    ("n = 2", "n = 0", "request[1].n", ">= 1"),
    ("frontend = 1", "frontend = 2", "request[1].frontend", "< frontends"),
    ("frontend = 1", "frontend = -1", "request[1].frontend", ">= 0"),
    ('"ipc.input:transit" = 0.0', '"ipc.input:transit" = -1.0', "ipc.input:transit", ">= 0"),
    ('"ipc.input:transit" = 0.0', '"ipc.input:transit" = "fast"', "ipc.input:transit",
     "number"),
    ('"ipc.input:transit" = 0.0', '"no.such:point" = 0.0', "no.such:point",
     "unknown await point"),
    ('"ipc.input:transit" = 0.0', '"ipc.input:transit#x" = 0.0', "ipc.input:transit#x",
     "whole number"),
    ('"ipc.input:transit" = 0.0', '"ipc.input:transit#²" = 0.0', "ipc.input:transit#²",
     "whole number"),
    ('"ipc.input:transit" = 0.0', '"ipc.input:transit#99999999999999999999" = 0',
     "ipc.input:transit#", "whole number"),
    ('"frontend.abort:after_pop#2" = 0.05', '"bogus#2" = 0.05', "bogus", "unknown await point"),
]


@pytest.mark.parametrize(("old", "new", "key", "problem"), VALUE_CASES)
def test_bad_value_names_file_line_key_and_value(old: str, new: str, key: str,
                                                  problem: str) -> None:
    text, line = mutate(old, new)
    message = error_of(text)
    assert message.startswith(f"x.toml:{line}: "), message
    assert key in message and problem in message


def test_bad_value_message_format() -> None:
    text, line = mutate("abort_at = 1.0", "abort_at = 0.25")
    assert error_of(text) == f"x.toml:{line}: request[1].abort_at: must be >= at (0.5) (got 0.25)"


@pytest.mark.parametrize(("after", "nth", "key", "allowed"), [
    ('summary = "s"', 0, "bogus", "horizon"),
    ("num_blocks = 64", 0, "engine.bogus", "step_time"),
    ("latency = 0.0005", 0, "ipc.bogus", "latency"),
    ("output_chunk_size = 128", 0, "frontend.bogus", "output_chunk_size"),
    ('proxy_ids = "client"', 0, "pd.bogus", "proxy_ids"),
    ('id = "B"', 0, "request[1].bogus", "abort_at"),
])
def test_unknown_keys(after: str, nth: int, key: str, allowed: str) -> None:
    text, line = mutate(after, after + "\nbogus = 1", nth)
    message = error_of(text)
    assert message.startswith(f"x.toml:{line + 1}: {key}: unknown"), message
    assert allowed in message


def test_unknown_top_level_table() -> None:
    text = BASE + "\n[extra]\na = 1\n"
    assert error_of(text).startswith(f"x.toml:{BASE.count(chr(10)) + 2}: extra: unknown")


def test_missing_required_keys() -> None:
    text, _ = mutate('name = "base"', "")
    assert error_of(text) == "x.toml: name: required key is missing"
    text, line = mutate('id = "A"', "")
    assert error_of(text) == f"x.toml:{line - 1}: request[0].id: required key is missing"


@pytest.mark.parametrize(("replacement", "fragment"), [
    ("", "at least one [[request]]"),
    ("request = 5", "array of tables"),
    ("request = []", "at least one [[request]]"),
    ('request = "X"', "array of tables"),
    ("request = [1, 2]", "request[0]: must be a table"),
    ("[request]\nid = 'X'", "array of tables"),
])
def test_bad_request_arrays(replacement: str, fragment: str) -> None:
    head = BASE.split("[[request]]")[0]
    if replacement.startswith("request ="):  # a top-level key must precede the tables
        text = replacement + "\n" + head
    else:
        text = head + replacement + "\n"
    message = error_of(text)
    assert fragment in message and "request" in message


@pytest.mark.parametrize("text", [
    'name = "n"\nengine = 5\n[[request]]\nid = "X"\n',
    'name = "n"\ndelays = "fast"\n[[request]]\nid = "X"\n',
    'name = "n"\nwitness = [1]\n[[request]]\nid = "X"\n',
])
def test_tables_given_as_scalars(text: str) -> None:
    assert error_of(text).startswith("x.toml:2: ")


def test_duplicate_plan_entries_after_normalisation() -> None:
    text = BASE + '"frontend.abort:after_pop#02" = 1.0\n'
    message = error_of(text)
    assert "twice" in message and message.startswith(f"x.toml:{BASE.count(chr(10)) + 1}:")


def test_huge_integer_literal_is_an_input_error() -> None:
    assert "x.toml" in error_of(BASE.replace("num_blocks = 64", "num_blocks = 1" + "0" * 5000))


def test_line_finder_ignores_headers_inside_strings_and_arrays() -> None:
    decoy = 'summary = """\n[engine]\nstep_time = 5\n"""\nfake = 0'
    text = BASE.replace('summary = "s"', decoy).replace("fake = 0\n", "")
    line = text.split("\n").index("step_time = 0.01") + 1
    message = error_of(text.replace("step_time = 0.01", "step_time = -1"))
    assert message.startswith(f"x.toml:{line}: engine.step_time"), message


def test_line_finder_copes_with_comments_escapes_and_brackets_in_strings() -> None:
    text = BASE.replace('name = "base"', 'name = "base" # a [comment] with "quotes\'')
    text = text.replace('id = "A"', 'id = "a\\"[{\'" # and \'[\' here')
    text = text.replace("[engine]", "[ engine ]  # the engine's table")
    text = text.replace('summary = "s"', "summary = '''\n[[request]]\nn = 0\n'''")
    assert parse_scenario(text, "x.toml").workload.requests[0].id == 'a"[{\''
    for old, new in (("n = 2", "n = 0"), ("step_time = 0.01", "step_time = 0")):
        line = text.split("\n").index(old) + 1
        message = error_of(text.replace(old, new))
        assert message.startswith(f"x.toml:{line}: "), message


def test_unexpected_exceptions_become_input_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("internal")

    monkeypatch.setattr(loader, "check_requests", boom)
    with pytest.raises(InputError, match=r"^x\.toml: invalid scenario: RuntimeError"):
        parse_scenario(BASE, "x.toml")


def test_syntax_error_has_source_and_line() -> None:
    text, line = mutate("num_blocks = 64", "num_blocks = ")
    message = error_of(text)
    assert message.startswith(f"x.toml:{line}: invalid TOML") and f"line {line}" in message


def test_dict_errors_have_no_line_and_cover_odd_inputs() -> None:
    good = base_dict()
    with pytest.raises(InputError, match=r"^<dict>: engine.num_blocks: must be >= 1 \(got 0\)$"):
        bad = copy.deepcopy(good)
        bad["engine"]["num_blocks"] = 0
        scenario_from_dict(bad)
    odd: list[Any] = [[1], None, "name = 'x'", {**good, 1: 2}, {**good, "name": None},
                      {**good, "request": [{"id": "X\ud800"}]}, {**good, "engine": {3: 4}},
                      {**good, "delays": {7: 1.0}}, {**good, "horizon": 10**5000}]
    for data in odd:
        with pytest.raises(InputError):
            scenario_from_dict(data)
