"""What a P/D step's ``update_from_output`` does that the trace must show (vllm backend).

vLLM's own Scheduler frees held blocks when the step's ``KVConnectorOutput`` lists them
(``_update_from_kv_xfer_finished``, v1/core/sched/scheduler.py:3556-3582: ``finished_sending``
on the prefill side; ``finished_recving`` of a request aborted while its read was in flight on
the decode side), and finishes with ERROR a decode request whose load failed under
``kv_load_failure_policy = "fail"`` although it was not scheduled (:2292-2303, 2552-2579). These
helpers record those as the model does (``pd.release``, ``sched.finish``), with the incarnation
of the Request object, before and after the call.
"""

from __future__ import annotations

from typing import Any

from racesim.engine_model.events.engine import SchedFinish
from racesim.engine_model.events.pd import PdRelease

__all__ = ["releases", "record_releases", "unscheduled_finishes"]


def releases(core: Any, kvo: Any) -> list[tuple[str, Any, str]]:
    """The held requests this step's output ends, read before ``update_from_output`` (which
    frees them and drops them from ``requests``): ``(ID, the Request, cause)``. vLLM applies
    them at the end of ``update_from_output``, after the step's own outputs (0.10.1.1
    scheduler.py:897, 0.33 :2580-2582), so :func:`record_releases` records them then."""
    requests = core.sched.requests
    transport = core.transport
    out: list[tuple[str, Any, str]] = []
    if kvo is None:
        return out
    for rid in kvo.finished_sending or ():
        req = requests.get(rid)
        if req is None:
            continue  # vLLM's own assert (scheduler.py:3580) decides what happens
        out.append((rid, req, transport.causes.pop(rid, "notify")))
    for rid in kvo.finished_recving or ():
        req = requests.get(rid)
        if req is not None and req.is_finished():  # aborted while its read was in flight
            out.append((rid, req, "recv-done"))
    return out


def record_releases(core: Any, ended: list[tuple[str, Any, str]]) -> dict[str, int]:
    """Record ``pd.release`` for each of :func:`releases`' requests, after the step's outputs;
    returns ID -> incarnation (the KV free that follows is theirs)."""
    out: dict[str, int] = {}
    for rid, req, cause in ended:
        inc = core.inc_of(req)
        core.world.emit(core.c_sched, rid, inc, PdRelease(cause, req.status.name))
        out[rid] = inc
    return out


def unscheduled_finishes(core: Any, watch: dict[str, Any], finished: dict[str, int]) -> None:
    """Record ``sched.finish`` for the requests ``update_from_output`` finished without
    scheduling them (a failed KV load); adds them to ``finished``."""
    for rid, req in watch.items():
        if req.is_finished():
            inc = core.inc_of(req)
            core.world.emit(core.c_sched, rid, inc,
                            SchedFinish(req.status.name, str(req.get_finished_reason())))
            finished[rid] = inc
