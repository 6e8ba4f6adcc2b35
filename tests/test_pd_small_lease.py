"""A NIXL lease under 6 s (issue 28; engine_model/kv_connector.py): vLLM 0.33.0 derives the
heartbeat interval as ``kv_lease_duration // 6`` (nixl/base_scheduler.py:82-88) and the lease
extension as ``kv_lease_duration * 2 // 3`` (nixl/base_worker.py:627-631), and refuses neither
value: a lease of 1-5 s gives an interval of 0, i.e. a heartbeat at every schedule()
(base_scheduler.py:513-518, ``now - last >= 0``). The model woke its idle loop for the next
heartbeat at ``last + 0`` = now, again and again, with no simulated time passing (a run grew
to 6 GB in 3.5 minutes). It now runs to its end, heartbeating on every step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from racesim.runner import RunSpec
from racesim.scenarios import load_scenario, parse_scenario, scenario_to_toml

_RUN = [sys.executable, "-I", "-m", "racesim", "run"]


def _with_lease(name: str, lease: float) -> str:
    text = scenario_to_toml(load_scenario(name))
    assert "[pd]" in text
    return text.replace("[pd]\n", f"[pd]\nhold_timeout = {lease}\n", 1)


@pytest.mark.parametrize("lease", [0.0, 1.0, 5.0])
@pytest.mark.parametrize("name", ["pd-reuse", "pd-push-pairing"])
def test_a_lease_under_6_s_runs_to_its_end(tmp_path: Path, name: str, lease: float) -> None:
    path = tmp_path / f"{name}.toml"
    path.write_text(_with_lease(name, lease), encoding="utf-8")
    try:  # a separate process: the spin it guards against never returns
        proc = subprocess.run([*_RUN, str(path), "--json"], capture_output=True, text=True,
                              timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} with a {lease} s lease still running after 120 s (the spin)")
    assert proc.returncode in (0, 1), proc.stderr


def _beats(lease: float) -> list[float]:
    scen = parse_scenario(_with_lease("pd-reuse", lease), f"pd-reuse-lease{lease}.toml")
    res = RunSpec.of(scen, "internal-id").run()
    return [e.time for e in res.trace if e.kind == "pd.heartbeat"]


def test_an_interval_of_0_heartbeats_on_every_step() -> None:
    """With a 5 s lease (interval 0) D heartbeats at its steps while it waits for P's blocks
    (the first slot to each P only starts the handshake, base_worker.py:3520-3532, so a 30 s
    lease sends none in this short run); never twice at one instant when idle (the model's
    step_time floor)."""
    small, default = _beats(5.0), _beats(30.0)
    assert len(small) >= 2 and default == []
    assert len(set(small)) == len(small)
