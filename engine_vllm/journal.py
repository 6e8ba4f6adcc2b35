"""The call journal: every call the vllm backend makes into vLLM's classes, in World order.

Off unless asked (:func:`recording`); ``racesim repro`` turns one into a script that makes the
same calls on the same objects without racesim (racesim/repro/). Recorded per engine:

- the ``Scheduler`` each engine builds (its ``VllmEngineShape``), and the calls the engine
  shell makes on it: ``add_request`` (the ``Request``'s constructor arguments, taken when it is
  added, before a connector touches its ``kv_transfer_params``), ``schedule`` (numbered),
  ``finish_requests``, ``update_from_output`` (which ``schedule``'s output, and the
  ``ModelRunnerOutput``'s IDs, sampled tokens and ``KVConnectorOutput``);
- NIXL push mode's worker (connectors/push.py): ``start_load_kv`` (with which ``schedule``'s
  metadata), ``get_transfer_results``, each writer pass, each notification that reached the
  agent (bytes), each WRITE the simulated transport completed.

Each entry carries the simulated time (``t``): the script sets the NIXL modules' clock to it.
A call into vLLM made inside a journaled one (vLLM calling itself) is not recorded.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Journal", "recording", "active"]

_ACTIVE: Journal | None = None


def active() -> Journal | None:
    """The journal being recorded, if any."""
    return _ACTIVE


@contextmanager
def recording() -> Iterator[Journal]:
    """Record the calls of the runs made inside the ``with`` (the last run's are kept)."""
    global _ACTIVE
    journal = Journal()
    _ACTIVE = journal
    try:
        yield journal
    finally:
        _ACTIVE = None


def _ids(values: Any) -> list[str] | None:
    return None if values is None else sorted(values)


class Journal:
    """The entries of one run (a new World's first engine starts it afresh)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.engines: dict[str, dict[str, Any]] = {}
        self._depth = 0
        self._steps: dict[str, int] = {}
        self._so: dict[int, tuple[Any, str, int]] = {}  # id(SchedulerOutput) -> (it, engine, k)
        self._world: Any = None

    def record(self, engine: str, op: str, **fields: Any) -> None:
        self.entries.append({"op": op, "e": engine, "t": float(self._world.now), **fields})

    def attach(self, core: Any, shape: Any, include_finished_set: bool) -> None:
        """Journal ``core``'s Scheduler (and its push worker, if any)."""
        if self._world is not core.world:  # a new run
            self.__init__()  # type: ignore[misc]
            self._world = core.world
        name = core.name
        self.engines[name] = {"shape": dataclasses.asdict(shape),
                              "include_finished_set": include_finished_set,
                              "connector": None}
        sched = core.sched
        self._wrap(sched, "add_request", lambda req: self._add(name, core, req))
        self._wrap(sched, "schedule", None, after=lambda so: self._schedule(name, so))
        self._wrap(sched, "finish_requests", lambda ids, status: self.record(
            name, "finish", ids=[ids] if isinstance(ids, str) else sorted(ids),
            status=status.name))
        self._wrap(sched, "update_from_output", lambda so, mro: self._update(name, so, mro))
        # a pause's state and a cache reset with running requests (preemptions) change what
        # later calls do: journaled so the replay makes them too
        if hasattr(sched, "set_pause_state"):
            self._wrap(sched, "set_pause_state",
                       lambda state: self.record(name, "pause", state=state.name))
        self._wrap(sched, "reset_prefix_cache", lambda *args: self.record(
            name, "reset", args=[bool(a) for a in args]))
        transport = getattr(core, "transport", None)
        if transport is not None and hasattr(transport, "journal"):
            self.engines[name]["connector"] = {"kind": "nixl-push",
                                               "engine_id": transport.engine_id,
                                               "lease": int(transport.lease)}
            transport.journal = self

    def _wrap(self, obj: Any, method: str, before: Any, after: Any = None) -> None:
        real = getattr(obj, method)

        def call(*args: Any) -> Any:
            outer = self._depth == 0
            if outer and before is not None:
                before(*args)
            self._depth += 1
            try:
                out = real(*args)
            finally:
                self._depth -= 1
            if outer and after is not None:
                after(out)
            return out

        setattr(obj, method, call)

    def _add(self, engine: str, core: Any, req: Any) -> None:
        sp = req.sampling_params
        params = req.kv_transfer_params
        self.record(engine, "add", inc=core.inc_of(req), req={
            "request_id": req.request_id, "prompt_token_ids": list(req.prompt_token_ids),
            "max_tokens": sp.max_tokens, "client_index": req.client_index,
            "arrival_time": float(req.arrival_time),
            "stop_token_ids": [int(t) for t in sp.stop_token_ids or ()],
            "resumable": bool(getattr(req, "resumable", False)),
            "kv_transfer_params": json.loads(json.dumps(params)) if params else None,
            "abort_immediately": bool(getattr(req, "abort_immediately", False))})

    def _schedule(self, engine: str, so: Any) -> None:
        k = self._steps.get(engine, 0) + 1
        self._steps[engine] = k
        self._so[id(so)] = (so, engine, k)
        self.record(engine, "schedule", step=k)

    def step_of(self, so_or_meta: Any) -> int | None:
        """The number of the ``schedule`` whose output (or connector metadata) this is."""
        for so, _engine, k in self._so.values():
            if so is so_or_meta or getattr(so, "kv_connector_metadata", None) is so_or_meta:
                return k
        return None

    def _update(self, engine: str, so: Any, mro: Any) -> None:
        kvo = mro.kv_connector_output
        self.record(engine, "update", step=self._so[id(so)][2], mro={
            "req_ids": list(mro.req_ids),
            "sampled_token_ids": [[int(t) for t in ts] for ts in mro.sampled_token_ids]},
            kvo=None if kvo is None else {
                "finished_sending": _ids(kvo.finished_sending),
                "finished_recving": _ids(kvo.finished_recving),
                "failed_recving": _ids(getattr(kvo, "failed_recving", None)),
                "invalid_block_ids": sorted(kvo.invalid_block_ids or ())})

    @staticmethod
    def encode(data: bytes) -> str:
        return base64.b64encode(data).decode()
