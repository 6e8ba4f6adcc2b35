"""Scenario loading and writing (scenarios/loader.py, scenario.py, _toml_writer.py); each key's
checks are test_scenario_checks.py's."""

from __future__ import annotations

import contextlib
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _scenario_text import BASE, HOSTILE_IDS, base_dict, scenario_of
from racesim.engine_model.config import EngineConfig, PDConfig, RequestSpec, Workload
from racesim.scenarios import (
    MAX_REQUEST_ID,
    Scenario,
    bundled_names,
    load_scenario,
    parse_scenario,
    scenario_from_dict,
    scenario_to_toml,
)
from racesim.scenarios import files as scenario_files
from racesim.scenarios._toml_writer import dumps, toml_string
from racesim.sim.errors import InputError


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
    s = scenario_of([rid, rid + "2"], abort_at=0.25)
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
    d = scenario_of(["X"]).to_dict()
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
    d = base_dict()
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
    s = scenario_of(["X"])
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
