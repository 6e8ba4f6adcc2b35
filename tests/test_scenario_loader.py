"""Scenario loading, validation and writing (scenarios/loader.py, scenarios/_toml_writer.py)."""

from __future__ import annotations

import contextlib
import copy
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.engine_model.config import EngineConfig, PDConfig, RequestSpec, Workload
from racesim.scenarios import (
    MAX_REQUEST_ID,
    Scenario,
    bundled_names,
    load_scenario,
    loader,
    parse_scenario,
    scenario_from_dict,
    scenario_to_toml,
)
from racesim.scenarios import files as scenario_files
from racesim.scenarios._toml_writer import dumps, toml_string
from racesim.sim.errors import InputError

BASE = '''\
name = "base"
summary = "s"
topology = "single"
frontends = 2
horizon = 10.0

[engine]
num_blocks = 64
block_size = 16
max_num_seqs = 16
max_num_batched_tokens = 2048
step_time = 0.01
async_scheduling = false

[ipc]
latency = 0.0005

[frontend]
output_chunk_size = 128

[pd]
transfer_time = 0.002
hold_timeout = 480.0
proxy_ids = "client"

[[request]]
id = "A"
at = 0.0
prompt_tokens = 32
max_tokens = 40

[[request]]
id = "B"
at = 0.5
prompt_tokens = 8
max_tokens = 8
abort_at = 1.0
eos_at = 4
stop_string_at = 3
disconnect_after_tokens = 2
n = 2
frontend = 1

[delays]
"ipc.input:transit" = 0.0

[witness]
"frontend.abort:after_pop#2" = 0.05
'''

HOSTILE_IDS = ['"><img src=x onerror=alert(2)>', 'a"b\\c', "héllo wörld ✓ 名前 🚀", "line\nbreak",
               "tab\there", "nul\x00del\x7fesc\x1b", "'single' \"double\"", "\\u0041 not an escape",
               "\u2028\u0085\ufeff", "# not a comment", "[[request]]", '"""', "'''", " "]


def _mutate(old: str, new: str, nth: int = 0) -> tuple[str, int]:
    """BASE with the nth line equal to ``old`` replaced by ``new``; returns (text, its line)."""
    lines = BASE.split("\n")
    hits = [i for i, line in enumerate(lines) if line == old]
    lines[hits[nth]] = new
    return "\n".join(lines), hits[nth] + 1


def _error(text: str, source: str = "x.toml") -> str:
    with pytest.raises(InputError) as info:
        parse_scenario(text, source)
    message = str(info.value)
    assert "\n" not in message
    return message


def _base_dict() -> dict[str, Any]:
    return tomllib.loads(BASE)


def _scenario(ids: list[str], **request: Any) -> Scenario:
    return scenario_from_dict({"name": "hostile", "summary": "ids: " + " ".join(ids),
                               "request": [{"id": i, **request} for i in ids]})


# --------------------------------------------------------------------------- happy path

def test_base_parses_into_the_config_records() -> None:
    s = parse_scenario(BASE, "x.toml")
    assert s.name == "base" and s.summary == "s" and s.source == "x.toml"
    w = s.workload
    assert (w.topology, w.frontends, w.horizon) == ("single", 2, 10.0)
    assert w.engine == EngineConfig(step_time=0.01, async_scheduling=False)
    assert w.requests[0] == RequestSpec(id="A", at=0.0, prompt_tokens=32, max_tokens=40)
    assert w.requests[1] == RequestSpec(id="B", at=0.5, prompt_tokens=8, max_tokens=8,
                                        abort_at=1.0, eos_at=4, stop_string_at=3,
                                        disconnect_after_tokens=2, n=2, frontend=1)
    assert s.delays == (("ipc.input:transit", None, 0.0),)
    assert s.witness == (("frontend.abort:after_pop", 2, 0.05),)


def test_defaults_and_int_accepted_for_floats() -> None:
    s = scenario_from_dict({"name": "n", "request": [{"id": "X", "at": 1}]})
    assert s.summary == "" and s.workload == Workload(requests=(RequestSpec(id="X", at=1.0),))
    assert isinstance(s.workload.requests[0].at, float)
    assert s.delays == () and s.witness == () and s.source == "<dict>"


def test_none_means_absent_for_optional_request_keys() -> None:
    s = scenario_from_dict({"name": "n", "request": [{"id": "X", "abort_at": None}]})
    assert s.workload.requests[0].abort_at is None


# --------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("rid", HOSTILE_IDS)
def test_round_trip_hostile_ids(rid: str, tmp_path: Path) -> None:
    s = _scenario([rid, rid + "2"], abort_at=0.25)
    assert scenario_from_dict(s.to_dict()) == s
    text = scenario_to_toml(s)
    back = parse_scenario(text, "t.toml")
    assert back == s and back.workload.requests[0].id == rid and back.source == "t.toml"
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    assert load_scenario(str(path)) == s


def test_round_trip_full_scenario_and_exact_floats() -> None:
    s = parse_scenario(BASE, "x.toml")
    assert scenario_from_dict(s.to_dict()) == s
    assert parse_scenario(scenario_to_toml(s), "y") == s
    odd = [0.1 + 0.2, 1e-300, 5e-324, 1 / 3, 1e16, 123456789.123456789, 2.0**60]
    requests = tuple(RequestSpec(id=str(i), at=v) for i, v in enumerate(odd))
    t = Scenario("floats", "", Workload(horizon=2.0**61, requests=requests),
                 (("engine.step:execute", 3, odd[3]),), (), "<test>")
    back = parse_scenario(scenario_to_toml(t), "z")
    assert [r.at for r in back.workload.requests] == odd and back.delays[0][2] == odd[3]
    assert back == t


def test_to_dict_shape_omits_defaults() -> None:
    d = _scenario(["X"]).to_dict()
    assert d["request"] == [{"id": "X", "at": 0.0, "prompt_tokens": 16, "max_tokens": 16}]
    assert set(d) == {"name", "summary", "topology", "frontends", "horizon", "engine", "ipc",
                      "request"}
    pd = parse_scenario(BASE.replace('topology = "single"', 'topology = "pd"'), "p").to_dict()
    assert pd["pd"] == {"transfer_time": 0.002, "hold_timeout": 480.0, "proxy_ids": "client",
                        "connector": "nixl-pull", "proxy": "engine-client",
                        "bidirectional_kv_xfer": False, "decoder_kv_blocks_ttl": 480.0}
    assert pd["witness"] == {"frontend.abort:after_pop#2": 0.05}
    assert pd["request"][1]["n"] == 2 and pd["request"][1]["frontend"] == 1


def test_equality_ignores_source() -> None:
    a = parse_scenario(BASE, "a.toml")
    b = parse_scenario(BASE, "b.toml")
    assert a == b and a.source != b.source and hash(a) == hash(b)


def test_toml_string_escapes_everything_tomllib_needs() -> None:
    for text in [*HOSTILE_IDS, "".join(map(chr, range(0x20))) + "\x7f\x80\x9f"]:
        assert tomllib.loads(f"k = {toml_string(text)}")["k"] == text
    assert "\n" not in toml_string("a\nb") and toml_string('"') == '"\\""'


@settings(max_examples=60, deadline=None, database=None)
@given(ids=st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=MAX_REQUEST_ID),
                    min_size=1, max_size=4),
       at=st.floats(min_value=0, max_value=1e12, allow_nan=False),
       summary=st.text(st.characters(codec="utf-8")))
def test_round_trip_property(ids: list[str], at: float, summary: str) -> None:
    s = scenario_from_dict({"name": summary, "summary": summary, "horizon": at + 1.0,
                            "request": [{"id": i, "at": at} for i in ids]})
    assert parse_scenario(scenario_to_toml(s), "h") == s
    assert scenario_from_dict(s.to_dict()) == s


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
    text, line = _mutate(old, new)
    message = _error(text)
    assert message.startswith(f"x.toml:{line}: "), message
    assert key in message and problem in message


def test_bad_value_message_format() -> None:
    text, line = _mutate("abort_at = 1.0", "abort_at = 0.25")
    assert _error(text) == f"x.toml:{line}: request[1].abort_at: must be >= at (0.5) (got 0.25)"


@pytest.mark.parametrize(("after", "nth", "key", "allowed"), [
    ('summary = "s"', 0, "bogus", "horizon"),
    ("num_blocks = 64", 0, "engine.bogus", "step_time"),
    ("latency = 0.0005", 0, "ipc.bogus", "latency"),
    ("output_chunk_size = 128", 0, "frontend.bogus", "output_chunk_size"),
    ('proxy_ids = "client"', 0, "pd.bogus", "proxy_ids"),
    ('id = "B"', 0, "request[1].bogus", "abort_at"),
])
def test_unknown_keys(after: str, nth: int, key: str, allowed: str) -> None:
    text, line = _mutate(after, after + "\nbogus = 1", nth)
    message = _error(text)
    assert message.startswith(f"x.toml:{line + 1}: {key}: unknown"), message
    assert allowed in message


def test_unknown_top_level_table() -> None:
    text = BASE + "\n[extra]\na = 1\n"
    assert _error(text).startswith(f"x.toml:{BASE.count(chr(10)) + 2}: extra: unknown")


def test_missing_required_keys() -> None:
    text, _ = _mutate('name = "base"', "")
    assert _error(text) == "x.toml: name: required key is missing"
    text, line = _mutate('id = "A"', "")
    assert _error(text) == f"x.toml:{line - 1}: request[0].id: required key is missing"


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
    message = _error(text)
    assert fragment in message and "request" in message


@pytest.mark.parametrize("text", [
    'name = "n"\nengine = 5\n[[request]]\nid = "X"\n',
    'name = "n"\ndelays = "fast"\n[[request]]\nid = "X"\n',
    'name = "n"\nwitness = [1]\n[[request]]\nid = "X"\n',
])
def test_tables_given_as_scalars(text: str) -> None:
    assert _error(text).startswith("x.toml:2: ")


def test_duplicate_plan_entries_after_normalisation() -> None:
    text = BASE + '"frontend.abort:after_pop#02" = 1.0\n'
    message = _error(text)
    assert "twice" in message and message.startswith(f"x.toml:{BASE.count(chr(10)) + 1}:")


def test_huge_integer_literal_is_an_input_error() -> None:
    assert "x.toml" in _error(BASE.replace("num_blocks = 64", "num_blocks = 1" + "0" * 5000))


def test_line_finder_ignores_headers_inside_strings_and_arrays() -> None:
    decoy = 'summary = """\n[engine]\nstep_time = 5\n"""\nfake = 0'
    text = BASE.replace('summary = "s"', decoy).replace("fake = 0\n", "")
    line = text.split("\n").index("step_time = 0.01") + 1
    message = _error(text.replace("step_time = 0.01", "step_time = -1"))
    assert message.startswith(f"x.toml:{line}: engine.step_time"), message


def test_line_finder_copes_with_comments_escapes_and_brackets_in_strings() -> None:
    text = BASE.replace('name = "base"', 'name = "base" # a [comment] with "quotes\'')
    text = text.replace('id = "A"', 'id = "a\\"[{\'" # and \'[\' here')
    text = text.replace("[engine]", "[ engine ]  # the engine's table")
    text = text.replace('summary = "s"', "summary = '''\n[[request]]\nn = 0\n'''")
    assert parse_scenario(text, "x.toml").workload.requests[0].id == 'a"[{\''
    for old, new in (("n = 2", "n = 0"), ("step_time = 0.01", "step_time = 0")):
        line = text.split("\n").index(old) + 1
        message = _error(text.replace(old, new))
        assert message.startswith(f"x.toml:{line}: "), message


def test_unexpected_exceptions_become_input_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("internal")

    monkeypatch.setattr(loader, "check_requests", boom)
    with pytest.raises(InputError, match=r"^x\.toml: invalid scenario: RuntimeError"):
        parse_scenario(BASE, "x.toml")


def test_syntax_error_has_source_and_line() -> None:
    text, line = _mutate("num_blocks = 64", "num_blocks = ")
    message = _error(text)
    assert message.startswith(f"x.toml:{line}: invalid TOML") and f"line {line}" in message


def test_dict_errors_have_no_line_and_cover_odd_inputs() -> None:
    good = _base_dict()
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


# --------------------------------------------------------------------------- loading files

def test_load_errors(tmp_path: Path) -> None:
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\x00\xff")
    with pytest.raises(InputError, match="UTF-8"):
        load_scenario(str(binary))
    nul = tmp_path / "nul.toml"
    nul.write_bytes(b"\x00")
    with pytest.raises(InputError, match="invalid TOML"):
        load_scenario(str(nul))
    with pytest.raises(InputError, match="no such scenario file"):
        load_scenario(str(tmp_path / "missing.toml"))
    with pytest.raises(InputError, match="directory"):
        load_scenario(str(tmp_path))
    with pytest.raises(InputError, match="unknown scenario 'no-such-name'"):
        load_scenario("no-such-name")
    for odd in ("", "a\x00b.toml", "x/" + "y" * 5000):
        with pytest.raises(InputError):
            load_scenario(odd)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.toml"
    path.write_text(BASE)
    path.chmod(0)
    with pytest.raises(InputError, match="cannot read"):
        load_scenario(str(path))


def test_load_path_names_the_file_in_errors(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.toml"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.replace("n = 2", "n = 0").encode())
    with pytest.raises(InputError) as info:
        load_scenario(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:") and "request[1].n" in message
    plain = tmp_path / "plainname"
    plain.write_text(BASE)
    monkeypatch.chdir(tmp_path)
    assert load_scenario("plainname").source == "plainname"


def test_bundled_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scenario_files, "_bundled_dir", lambda: tmp_path)
    assert bundled_names() == ()
    (tmp_path / "beta.toml").write_text(BASE)
    (tmp_path / "alpha.toml").write_text(BASE.replace('"base"', '"alpha"'))
    (tmp_path / "notes.txt").write_text("x")
    assert bundled_names() == ("alpha", "beta")
    s = load_scenario("alpha")
    assert s.name == "alpha" and s.source == "<bundled alpha>"
    with pytest.raises(InputError, match=r"unknown scenario 'gamma'.*alpha, beta"):
        load_scenario("gamma")
    monkeypatch.setattr(scenario_files, "_bundled_dir", lambda: tmp_path / "absent")
    assert bundled_names() == ()


def test_real_bundled_names_is_a_sorted_tuple() -> None:
    names = bundled_names()
    assert isinstance(names, tuple) and list(names) == sorted(names)


# --------------------------------------------------------------------------- fuzz: nothing escapes

_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), junk=_JUNK)
def test_fuzz_only_input_errors(data: st.DataObject, junk: Any) -> None:
    d = _base_dict()
    path = data.draw(st.sampled_from(_paths(d)))
    target = d
    for seg in path[:-1]:
        target = target[seg]
    target[path[-1]] = junk
    attempts: list[Callable[[], object]] = [lambda: scenario_from_dict(d)]
    try:
        text = dumps(d)  # TOML has no null: junk holding None inside an array is unwritable
        attempts.append(lambda: parse_scenario(text, "f.toml"))
    except TypeError:
        pass
    for attempt in attempts:
        try:
            attempt()
        except InputError as e:
            assert "\n" not in str(e)


@settings(max_examples=150, deadline=None, database=None)
@given(text=st.text(max_size=60) | st.sampled_from(BASE.split("\n")).map(lambda s: BASE + s))
def test_fuzz_text_only_input_errors(text: str) -> None:
    with contextlib.suppress(InputError):
        parse_scenario(text, "f")


def test_pd_config_default_is_omitted_for_single() -> None:
    s = _scenario(["X"])
    assert "pd" not in s.to_dict() and s.workload.pd == PDConfig()


def test_a_request_that_can_never_fit_the_kv_pool_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\n[engine]\nnum_blocks = 4\nblock_size = 16\n'
                    '[[request]]\nid = "X"\nprompt_tokens = 60\nmax_tokens = 4\n'
                    '[[request]]\nid = "Y"\nprompt_tokens = 60\nmax_tokens = 5\n')
    with pytest.raises(InputError) as err:
        load_scenario(str(path))
    message = str(err.value)
    assert "request[1].max_tokens" in message and "engine.num_blocks (4)" in message
    assert ":12:" in message  # the line of Y's max_tokens
