"""Whose abort ends whose request: abort-isolation and orphan-run.

A client gives up on its request by aborting it (a router's ``/abort_requests``), by
disconnecting, or by its handler task being cancelled. Two things can then go wrong in vLLM
0.33, both invisible to the ID-level invariants:

- **abort-isolation** (security): the abort ends another client's request. An abort by external
  ID ends every internal ID registered under it (v1/engine/output_processor.py:627), whichever
  client sent it, so one client reusing another's ``X-Request-Id`` can end its request.
  ``abort-precision`` judges an abort by the ID it names and counts that as intended.
- **orphan-run**: the abort ends nothing, and the engine keeps stepping a request no client
  waits for, while its frontend still tracks it (so ``frontend-covers-engine`` is silent). An
  abort that names the client's bare ID where the endpoint registered ``chatcmpl-<id>`` does
  this: an unknown external ID aborts nothing (output_processor.py:627). So does a Responses
  API cancel that is refused, or that cancels another client's task. A client counts as
  having given up only through such an abort that ended nothing of its own: an abort that
  went out and a P/D proxy's stages are the other monitors' business.

The client that asked is matched to the frontend's abort decision by time: a client's abort
event and the ``fe.abort_issue`` (or ``fe.abort_noop``) it causes are emitted in one tick,
with no await between (AsyncLLM.abort's OutputProcessor call comes before its first await).
"""

from __future__ import annotations

from typing import cast

from racesim.engine_model.events import (
    ApiCancel,
    ClientAbort,
    ClientCancel,
    ClientDisconnect,
    FeAbortIssue,
    FeAbortNoop,
    SchedStep,
)
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["AbortIsolation"]


class AbortIsolation:
    """Judges each client-issued abort by whose requests it ends, and what runs on after."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report
        #: the client whose abort the next fe.abort_issue in the same tick carries out
        self._asker: tuple[int, float | int] | None = None
        #: clients that gave their request up, and when
        self._abandoned: dict[int, float | int] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(ClientAbort.KIND, self.client_gives_up),
                (ClientDisconnect.KIND, self.client_gives_up),
                (ClientCancel.KIND, self.client_gives_up),
                (FeAbortIssue.KIND, self.fe_abort_issue), (FeAbortNoop.KIND, self.fe_abort_noop),
                (SchedStep.KIND, self.sched_step), (ApiCancel.KIND, self.api_cancel)]

    def client_gives_up(self, ev: TraceEvent) -> None:
        uid = cast(ClientAbort, ev.detail).uid  # the three kinds carry only the uid
        self._asker = (uid, ev.time)

    def _take_asker(self, ev: TraceEvent) -> int | None:
        asker = self._asker
        self._asker = None
        if asker is None or asker[1] != ev.time:
            return None
        return asker[0]

    def fe_abort_noop(self, ev: TraceEvent) -> None:
        asker = self._take_asker(ev)
        if asker is not None:  # the client's abort named nothing this frontend knows
            self._abandoned.setdefault(asker, ev.time)

    def fe_abort_issue(self, ev: TraceEvent) -> None:
        d = cast(FeAbortIssue, ev.detail)
        asker = self._take_asker(ev)
        if asker is None or d.cause != "abort":
            return
        truth = self.truth
        engine = truth.fe_engine.get(ev.component, "")
        for n, rid in enumerate(d.ids):
            if d.engines is not None:
                engine = truth.engine_names[d.engines[n]]
            for inc in truth.snapshot(engine, rid):
                i = truth.incs[inc]
                if i.uid == asker or not truth.client_waiting(i.uid):
                    continue
                self.report.violate(
                    "abort-isolation", (asker, inc), ev, rid,
                    f"client uid {asker}'s abort of {ev.request or rid!r} ends {truth.who(inc)}, "
                    f"another client's request under {rid!r}")

    def api_cancel(self, ev: TraceEvent) -> None:
        """The Responses API cancels the background task registered under the response ID,
        whoever's it is (openai/responses/serving.py:1198-1199)."""
        d = cast(ApiCancel, ev.detail)
        if d.task != d.uid:  # refused, or another client's task: the asker's own runs on
            self._abandoned.setdefault(d.uid, ev.time)
        if d.task and d.task != d.uid and self.truth.client_waiting(d.task):
            self.report.violate(
                "abort-isolation", (d.uid, "task", d.task), ev, ev.request,
                f"client uid {d.uid}'s cancel of response {ev.request!r} cancels the "
                f"background task of client uid {d.task}, registered under the same ID")

    def sched_step(self, ev: TraceEvent) -> None:
        abandoned = self._abandoned
        if not abandoned:
            return
        truth = self.truth
        for rid, inc, _n in cast(SchedStep, ev.detail).batch:
            i = truth.incs.get(inc)
            if (i is None or i.uid not in abandoned or not i.tracked or i.abort_pending
                    or i.held):
                continue
            self.report.violate(
                "orphan-run", inc, ev, rid,
                f"{truth.engine_of(ev.component)} steps {rid!r} ({truth.who(inc)}) although its "
                f"client gave it up at t={abandoned[i.uid]:g} and no ABORT for it is pending: "
                f"{i.frontend} still tracks it")
