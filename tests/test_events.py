"""The event vocabulary: every kind declared once, as a record whose JSON is its dict; emitters
build records and readers read attributes (the sources are scanned for the string forms)."""

from __future__ import annotations

import gc
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from racesim.engine_model import RequestSpec, Workload, load_policy, run_workload
from racesim.engine_model.checker import Checker
from racesim.engine_model.config import EngineConfig
from racesim.engine_model.events import KEY_KINDS, KINDS, FeAdd, SchedFinish
from racesim.sim import NATIVE, EventRecord, TraceEvent, UndeclaredKind, World, canonical_json
from racesim.sim.trace import record_class, record_classes

ROOT = Path(__file__).resolve().parent.parent
# the vocabulary's own docstring shows the string form, to say who may use it
SOURCES = [p for d in ("sim", "engine_model", "scenarios", "reports", "racesim")
           for p in sorted((ROOT / d).rglob("*.py")) if p.parts[-2:] != ("events", "__init__.py")]


def test_every_kind_is_declared_once_in_the_events_modules() -> None:
    assert record_classes() == KINDS
    for kind, cls in KINDS.items():
        assert kind == cls.KIND
        assert cls.__module__.startswith("racesim.engine_model.events.") or kind == "delay"
    assert set(KINDS) > KEY_KINDS


def _on_the_source_build(request: pytest.FixtureRequest) -> bool:
    """On a compiled build, run this test again on the source modules (RACESIM_PURE) in a
    child process, where classes keep their docstrings and signatures; True when it did."""
    if not NATIVE:
        return False
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{__file__}::{request.node.name}"],
        env={**os.environ, "RACESIM_PURE": "1"}, capture_output=True, text=True)
    assert child.returncode == 0 and "1 passed" in child.stdout, child.stdout[-2000:]
    return True


def test_a_records_fields_and_docstring_match_its_declaration(
        request: pytest.FixtureRequest) -> None:
    if _on_the_source_build(request):
        return
    for kind, cls in KINDS.items():
        assert cls.__doc__ and cls.__doc__.startswith(f"{kind}:"), cls
        params = list(inspect.signature(cls).parameters)
        assert params == list(cls.__slots__), cls
        assert set(cls.__slots__) >= cls.OPTIONAL, cls


def test_an_optional_field_is_left_out_of_the_json_while_none() -> None:
    assert FeAdd(1, "X", 0).as_dict() == {"uid": 1, "external": "X", "index": 0}
    assert FeAdd(1, "X", 0, tracked=False).as_dict()["tracked"] is False
    assert SchedFinish("FINISHED_ABORTED", "abort", 0).as_dict()["abort"] == 0
    assert "abort" not in SchedFinish("FINISHED_STOPPED", "stop").as_dict()


def test_a_runs_records_round_trip_through_their_json_and_narrate() -> None:
    workload = Workload(engine=EngineConfig(step_time=0.01), requests=(
        RequestSpec("X", prompt_tokens=32, max_tokens=5, abort_at=0.02),
        RequestSpec("X", at=0.03, max_tokens=3)))
    result = run_workload(workload, load_policy("buggy"))
    seen = set()
    for ev in result.trace:
        seen.add(ev.kind)
        row = ev.as_list()
        back = TraceEvent.from_list(row)
        assert back.detail == ev.detail and back.as_list()[6] == row[6]
        assert canonical_json([back.detail]) == canonical_json([row[6]])
        assert ev.detail.describe(ev)
    assert {"client.send", "sched.step", "kv.alloc", "ipc.send", "client.done"} <= seen


def test_a_kind_nobody_declared_fails_at_its_emit() -> None:
    world = World(0)
    with pytest.raises(UndeclaredKind, match=r"'no\.such\.kind' is not declared"):
        world.record("E0.scheduler", "no.such.kind", "X", 1, anything=1)
    assert world.trace.count == 0


def test_every_kind_a_monitor_reads_is_declared() -> None:
    assert Checker(World(0)).kinds() <= set(KINDS)


def test_two_records_of_one_kind_are_an_error() -> None:
    class Twin(EventRecord):
        """fe.add: a second declaration."""

        KIND = "fe.add"
        __slots__ = ()

    with pytest.raises(TypeError, match=r"'fe\.add' is declared twice"):
        record_classes()
    del Twin
    gc.collect()
    assert record_classes() == KINDS
    assert record_class("fe.add") is FeAdd


# A string kind at an emit (world.record(..., "kind", ...) or trace.record) or a dict read of a
# detail (ev.detail.x, .get("x")) in the sources: the vocabulary is bypassed.
_STRING_EMIT = re.compile(r"\.record\(\s*[^,()]+,\s*[\"']")
_DICT_READ = re.compile(r"\.detail(?:\[|\.get\()")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sources_emit_records_and_read_attributes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not _STRING_EMIT.search(text), f"{path}: emit a record (world.emit), not a string kind"
    assert not _DICT_READ.search(text), f"{path}: read a record's fields by attribute"
