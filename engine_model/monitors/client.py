"""What clients see: one-terminal-output, no-crosstalk and no-hang."""

from __future__ import annotations

from typing import cast

from racesim.engine_model.events import (
    ClientDone,
    ClientOutput,
    ClientSend,
    PdPushWrite,
    PdRead,
)
from racesim.engine_model.monitors.truth import Client, GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["ClientOutputs"]


class ClientOutputs:
    """Judges each client request's outputs and each P/D read against the incarnations."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(PdRead.KIND, self.pd_read), (PdPushWrite.KIND, self.pd_push_write),
                (ClientSend.KIND, self.client_send),
                (ClientOutput.KIND, self.client_output), (ClientDone.KIND, self.client_done)]

    def pd_read(self, ev: TraceEvent) -> None:
        truth = self.truth
        want = cast(PdRead, ev.detail).remote_inc
        mine = truth.incs.get(ev.inc)
        theirs = truth.incs.get(want)
        if mine is not None and theirs is not None and mine.uid != theirs.uid:
            self.report.violate("no-crosstalk", ("read", ev.inc), ev, ev.request,
                                f"decode {truth.who(ev.inc)} reads the KV of {truth.who(want)}")

    def pd_push_write(self, ev: TraceEvent) -> None:
        """NIXL push mode: P's request ``ev.inc`` was written into decode request
        ``dest_inc``'s blocks; they must be one client's."""
        truth = self.truth
        d = cast(PdPushWrite, ev.detail)
        dest = d.dest_inc
        how = "transfer_id" if d.matched == "transfer_id" else "push"
        mine = truth.incs.get(dest)
        theirs = truth.incs.get(ev.inc)
        if mine is not None and theirs is not None and mine.uid != theirs.uid:
            self.report.violate("no-crosstalk", ("read", dest), ev, ev.request,
                                f"decode {truth.who(dest)} receives the KV of "
                                f"{truth.who(ev.inc)} ({how} pairing)")

    def client_send(self, ev: TraceEvent) -> None:
        d = cast(ClientSend, ev.detail)
        uid = d.uid
        self.truth.clients[uid] = Client(uid, ev.request or "", ev.seq, d.prompt or "",
                                         d.prompt_tokens)

    def client_output(self, ev: TraceEvent) -> None:
        d = cast(ClientOutput, ev.detail)
        uid = d.uid
        if d.after_done:
            self.report.violate("one-terminal-output", ("after", uid), ev, ev.request,
                                f"{ev.component} ({ev.request!r}) received an output after its "
                                f"terminal output")
        truth = self.truth
        incs = truth.incs
        for index, inc, ctx in d.tokens:
            i = incs.get(inc)
            if i is None or i.uid != uid or i.index != index:
                self.report.violate("no-crosstalk", ("token", uid), ev, ev.request,
                                    f"{ev.component} ({ev.request!r}, uid {uid}) received a "
                                    f"token generated for {truth.who(inc)}")
                break
            if ctx:
                c = incs.get(ctx)
                if c is None or c.uid != uid:
                    self.report.violate(
                        "no-crosstalk", ("ctx", uid), ev, ev.request,
                        f"{ev.component} ({ev.request!r}) received a token computed "
                        f"from the sampled token of {truth.who(ctx)} (async carry-over "
                        f"matched by ID)")
                    break

    def client_done(self, ev: TraceEvent) -> None:
        d = cast(ClientDone, ev.detail)
        c = self.truth.clients.get(d.uid)
        if c is None:
            return
        if c.terminal is not None:
            self.report.violate("one-terminal-output", ("twice", c.uid), ev, ev.request,
                                f"{ev.component} ({ev.request!r}) got a second terminal output "
                                f"({d.reason} after {c.terminal})")
        else:
            c.terminal = d.reason

    def finish(self, now: float | int) -> None:
        for c in self.truth.clients.values():
            if c.terminal is None:
                self.report.violate("no-hang", ("hang", c.uid), None, c.rid,
                                    f"client request {c.rid!r} (uid {c.uid}) has no terminal "
                                    f"output at t={now:g}", time=now)
