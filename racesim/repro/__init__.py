"""``racesim repro``: a counterexample as a script a vLLM maintainer runs without racesim.

The counterexample is replayed on the vllm backend with the call journal on
(``racesim.engine_vllm.journal``): every call the backend made into vLLM's classes, in order,
with its arguments and simulated time. The script builds the same objects (one ``Scheduler``
per engine from the same config; NIXL push mode's worker from connectors/nixl_fakes.py, whose
text it copies), makes the same calls, and fails where the run did: with vLLM's own exception
(an engine death whose ``vllm_where`` is vLLM's file:line), or, for NIXL push mode's pairing,
with an assertion on vLLM's own state (P's writer paired requests whose prompts differ).

A counterexample whose violation is seen only in a simulated part (the model backend, the
model's clients and proxy, the frontend whose calls are not journaled, NIXL pull mode's
simulated read) is refused: one line naming that part (exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from racesim.documents import read_counterexample
from racesim.runner import RunSpec
from racesim.sim import InputError

__all__ = ["Repro", "make_repro"]

#: the vLLM releases whose calling convention the script's driver uses (racesim/repro/driver.py:
#: ``Scheduler(block_size=)``, ``EngineCoreRequest(resumable=, external_req_id=)``)
RELEASES = ("0.20.0", "0.33.0")


@dataclass(frozen=True)
class Repro:
    """A rendered reproducer: the script's text, the release it needs, what it must raise."""

    script: str
    release: str
    expect: str
    calls: int


def _source(path: Path) -> str:
    """A module's text without its ``from __future__`` line (the script has one at its top)."""
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("from __future__ import"))


def _expectation(cx: Any) -> tuple[str, str] | None:
    """(kind, what the script must fail with) for the first violation vLLM's classes show."""
    for v in cx.violations:
        if v.get("invariant") == "engine-alive" and v.get("vllm_where"):
            detail = str(v.get("detail", ""))
            error = detail.split("engine died: ", 1)[-1].split(" at vllm/", 1)[0]
            return "exception", f"{error} at vllm/{v['vllm_where']}"
        if v.get("invariant") == "no-crosstalk" and "push pairing" in str(v.get("detail")):
            return "pairing", ("AssertionError: crosstalk: P's push writer pairs one client's "
                               "prefill with another client's decode registration")
    return None


def _refusal(cx: Any, result: Any) -> str:
    """Which simulated part the counterexample's violations are seen in."""
    first = cx.violations[0] if cx.violations else {}
    seq = first.get("event", -1)
    where = "the end of the run (a check over the whole trace)"
    if isinstance(seq, int) and 0 <= seq < len(result.trace):
        where = f"{result.trace[seq].component!r}"
    return (f"its violation ({first.get('invariant', 'none')}) is seen at {where}, a part "
            f"racesim simulates (clients, proxy, sockets, the frontend's calls): no call into "
            f"vLLM's classes fails")


def make_repro(path: str) -> Repro:
    """The reproducer of counterexample file ``path`` (InputError, one line, if it has none)."""
    cx = read_counterexample(path)
    if cx.engine != "vllm":
        raise InputError(f"{path}: repro needs a counterexample found on vLLM's own classes "
                         f"(engine 'vllm'); this one ran on racesim's model, a simulated part "
                         f"(explore or replay it with --engine vllm)")
    if cx.runner == "model":
        raise InputError(f"{path}: it ran racesim's model of the runner "
                         f"(RACESIM_VLLM_RUNNER=model), a simulated part; explore or replay it "
                         f"on vLLM's own runner (the variable unset) for a repro")
    w = cx.scenario.workload
    if w.topology == "pd" and w.pd.connector == "mooncake":
        raise InputError(f"{path}: it depends on simulated parts, MooncakeConnector's "
                         f"TransferEngine, sockets and sender/receiver threads "
                         f"(engine_vllm/connectors/mooncake.py); repro renders NIXL push mode "
                         f"only")
    if w.topology == "pd" and w.pd.connector != "nixl-push":
        raise InputError(f"{path}: it depends on a simulated part, the NIXL "
                         f"{w.pd.connector} transport's read and get_transfer_results "
                         f"(engine_vllm/connectors/nixl.py); repro renders push mode only")
    expect = _expectation(cx)
    from racesim.engine_vllm import journal
    from racesim.engine_vllm._vllm import vllm

    spec = RunSpec(cx.scenario, cx.policy, tuple(cx.options.items()), cx.seed, cx.skip, "vllm")
    with journal.recording() as j:
        result = spec.run(schedule=cx.schedule)
    if result.trace_hash != cx.trace_hash:
        raise InputError(f"{path}: replaying it here gives another trace ({result.trace_hash[:12]}"
                         f" vs {cx.trace_hash[:12]}): repro needs the run the file recorded")
    if expect is None:
        raise InputError(f"{path}: {_refusal(cx, result)}")
    release = vllm().version.split("+")[0]
    if release not in RELEASES:
        raise InputError(f"{path}: repro renders vLLM {', '.join(RELEASES)}'s calling "
                         f"convention; this is vLLM {release}")
    model = json.loads((resources.files("racesim.engine_vllm") / "tiny_model" /
                        "config.json").read_text())
    doc = {"release": release, "expect": expect[1], "model_config": model,
           "engines": j.engines, "entries": j.entries}
    return Repro(_render(cx, path, doc, expect), release, expect[1], len(j.entries))


def _render(cx: Any, path: str, doc: dict[str, Any], expect: tuple[str, str]) -> str:
    here = Path(__file__).resolve().parent
    fakes = here.parent / "engine_vllm" / "connectors" / "nixl_fakes.py"
    if not fakes.exists():  # installed: the folders are subpackages of racesim
        fakes = Path(str(resources.files("racesim.engine_vllm.connectors") / "nixl_fakes.py"))
    release = doc["release"]
    name = cx.scenario.name
    head = f'''#!/usr/bin/env python3
"""Reproducer for {name} under {cx.policy} on vLLM {release} (racesim counterexample
{Path(path).name}, trace {cx.trace_hash[:16]}).

Needs vLLM {release} only (pip install vllm=={release}; the CPU build is enough: no GPU, no
weights, no racesim). Run: python {Path(path).stem}_repro.py

It builds what racesim's vllm backend built: one vLLM Scheduler per engine from a VllmConfig of
a tiny OPT config (no weights){", and for NIXL push mode vLLM's own NixlPushConnectorWorker with a fake NIXL agent (memory registration, notifications and the RDMA WRITE are simulated, below)" if doc["engines"] and any(e["connector"] for e in doc["engines"].values()) else ""}.
Then it makes the {len(doc["entries"])} calls the run made into vLLM's classes, in the run's order,
with the run's arguments (JOURNAL below; "t" is the simulated time the NIXL modules' clock
reads). Sampled tokens are the run's (its fake model runner's).

Expected failure: {expect[1]}
"""

from __future__ import annotations

import json

JOURNAL = json.loads(r"""
{json.dumps(doc, indent=None, sort_keys=True)}
""")

# ---- NIXL stand-ins (racesim engine_vllm/connectors/nixl_fakes.py) ----
'''
    tail = '''

if __name__ == "__main__":
    sys.exit(main(JOURNAL))
'''
    return (head + _source(fakes) + "\n\n# ---- the replay (racesim repro/driver.py) ----\n"
            + _source(here / "driver.py") + tail)
