"""``racesim conform --frontend``: the model's frontend against vLLM's own AsyncLLM, both on
vLLM's engine classes, on every bundled scenario vLLM's frontend runs on the installed release
(0.33.0 in the main venv, 0.20.0 in CI's second venv: tests/conftest.py ``ANY_RELEASE``).

A new difference between the two frontends fails here until it is fixed (vLLM wins) or listed
with its cause in ``racesim.conform.frontend.KNOWN_FRONTEND`` (shown in docs/conform.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import racesim.conform as conform_module
from racesim.conform import conform
from racesim.conform.frontend import KNOWN_FRONTEND, SIDES, default_policies
from racesim.conform.known import markdown_table
from racesim.engine_model import RunResult
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario

CONFORM_DOC = Path(__file__).parents[1] / "docs" / "conform.md"
#: a point only the second side passes in the fake below (a frontend-only point)
ONLY_ONE_SIDE = "engine.step:execute"


def test_the_conform_doc_shows_the_frontend_table() -> None:
    text = CONFORM_DOC.read_text(encoding="utf-8")
    block = text.split("<!-- table: known-frontend-mismatches -->\n", 1)[1].split("\n\n", 1)[0]
    assert block.strip() == markdown_table(KNOWN_FRONTEND)


def test_two_frontends_are_perturbed_only_where_both_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drawing side's schedules never delay a point the other side does not pass (the
    model's and vLLM's frontends name their own await points differently)."""
    drawn: list[tuple[str, ...]] = []

    def run_on(engine: str, scenario: Any, policy: str, **kwargs: Any) -> RunResult:
        r = run_scenario(scenario, policy, **kwargs)
        if engine == SIDES[1]:
            occ = {p: n for p, n in r.occurrences.items() if p != ONLY_ONE_SIDE}
            return dataclasses.replace(r, occurrences=occ)
        drawn.append(tuple(d.point for d in r.schedule))
        return r

    monkeypatch.setattr(conform_module, "run_on", run_on)
    monkeypatch.setattr(conform_module, "check_backend", lambda scenario: None)
    monkeypatch.setattr(conform_module, "model_only", lambda *a: None)
    res = conform([load_scenario("abort-reuse")], [("buggy", {})], budget=12, workers=1,
                  engines=SIDES)
    assert res.runs == 12 and not res.mismatches
    points = {p for schedule in drawn for p in schedule}
    assert points and ONLY_ONE_SIDE not in points
    # the same strategy over one engine's points does delay it
    drawn.clear()
    conform([load_scenario("abort-reuse")], [("buggy", {})], budget=12, workers=1,
            engines=("model", "vllm"))
    assert ONLY_ONE_SIDE in {p for schedule in drawn for p in schedule}


@pytest.mark.vllm
def test_the_two_frontends_agree_on_every_bundled_scenario_both_run(tmp_path: Path) -> None:
    from racesim.engine_vllm.support import release_gap
    from racesim.engine_model.versions import profile_gap
    from racesim.runner.engines import installed_profile, installed_vllm

    release = installed_vllm()
    scens = [load_scenario(n).with_vllm(installed_profile()) for n in bundled_names()]
    scens = [s for s in scens
             if profile_gap(s.workload) is None and release_gap(s.workload, release) is None]
    res = conform(scens, default_policies(release), budget=3, workers=1, out_dir=tmp_path,
                  engines=SIDES)
    compared = [c for c in res.cells if not c["model_only"]]
    assert len(compared) >= 12, [c["model_only"] for c in res.cells]
    assert sum(c["violating_runs"] for c in compared) > 0  # races compared, not only quiet runs
    assert not res.unlisted, [(m.scenario, m.policy, m.run, m.differences, m.path)
                              for m in res.unlisted]
