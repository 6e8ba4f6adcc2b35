"""Trace hashes pinned for the default profile, vLLM 0.33: every bundled scenario under every
built-in policy, with no delay and (where it has one) with its witness.

``test_trace_stability.py`` pins the 0.8 profile against hashes recorded before profiles
existed; this file does the same for 0.33, so a change to the 0.33 model cannot change a trace
unnoticed. A change that *means* to change it re-records the fixture in the same commit and
says why: ``python tests/test_trace_pins_033.py --record``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from racesim.engine_model import POLICIES
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario

FIXTURE = Path(__file__).parent / "fixtures" / "trace_hashes_033.json"
VLLM = "0.33"


def _keys() -> list[str]:
    keys = []
    for name in bundled_names():
        witnesses = (False, True) if load_scenario(name).witness else (False,)
        keys += [f"{name} {policy} witness={w}" for policy in POLICIES for w in witnesses]
    return keys


def _hash(key: str) -> str:
    name, policy, tag = key.split()
    scenario = load_scenario(name).with_vllm(VLLM)
    return run_scenario(scenario, policy, witness=tag == "witness=True").trace_hash


def _recorded() -> dict[str, str]:
    data: dict[str, str] = json.loads(FIXTURE.read_text(encoding="utf-8"))["runs"]
    return data


def test_the_fixture_covers_every_bundled_scenario_and_policy() -> None:
    assert sorted(_recorded()) == sorted(_keys())


@pytest.mark.parametrize("key", _keys())
def test_trace_hash_matches_the_pinned_one(key: str) -> None:
    assert _hash(key) == _recorded()[key]


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    runs = {key: _hash(key) for key in _keys()}
    FIXTURE.write_text(json.dumps({"vllm": VLLM, "runs": runs}, indent=1, sort_keys=True) + "\n",
                       encoding="utf-8")
    print(f"recorded {len(runs)} hashes in {FIXTURE}")
