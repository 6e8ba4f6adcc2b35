"""What ``racesim conform`` compares between two backends: a run's observable outcome.

An :class:`Outcome` keeps, per client request, what the client received and how it ended; the
violated invariants with their reach; and which engines died. Nothing in it depends on how a
backend numbers its internal objects: a token is named by the client that *sent* the request it
was generated for (ground truth from the incarnation, never from a request ID), so crosstalk
reads as another client's number on either backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from racesim.engine_model import RunResult
from racesim.engine_model.events import ClientOutput, ClientSend, EngineFatalEvent, FeAdd
from racesim.engine_model.invariants import RUNNER_INVARIANTS

__all__ = ["Outcome", "RequestView", "outcome_of", "differences"]

#: A run of consecutive tokens: (child index for n > 1, sender client, carried-input client or
#: -1 when the token's input was its own, count).
Span = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class RequestView:
    """One client request's outcome: counts, finish reason, and whose tokens it got, in order."""

    id: str
    frontend: int
    tokens: int
    finish_reason: str | None
    received: tuple[Span, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "frontend": self.frontend, "tokens": self.tokens,
                "finish_reason": self.finish_reason,
                "received": [list(s) for s in self.received]}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One backend's run, reduced to what conformance compares."""

    engine: str
    trace_hash: str
    requests: tuple[RequestView, ...]
    #: (invariant, reach of its first violation), in the order they were first detected
    invariants: tuple[tuple[str, str], ...]
    #: the engines that reached a fatal error ("engine", "prefill"...), with the error's type
    dead_engines: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "trace_hash": self.trace_hash,
                "requests": [r.as_dict() for r in self.requests],
                "invariants": [{"invariant": n, "reach": r} for n, r in self.invariants],
                "dead_engines": [{"engine": c, "error": e} for c, e in self.dead_engines]}


def _spans(tokens: Iterable[tuple[int, int, int]]) -> tuple[Span, ...]:
    out: list[list[int]] = []
    for child, sender, carried in tokens:
        if out and out[-1][:3] == [child, sender, carried]:
            out[-1][3] += 1
        else:
            out.append([child, sender, carried, 1])
    return tuple((a, b, c, d) for a, b, c, d in out)


def outcome_of(result: RunResult, engine: str = "") -> Outcome:
    """Reduce a run that kept its trace (``retain_trace=True``) to its :class:`Outcome`."""
    if not result.trace:
        raise ValueError("conformance needs a run that kept its trace")
    client_of_uid: dict[int, int] = {}
    uid_of_inc: dict[int, int] = {}
    received: dict[int, list[tuple[int, int, int]]] = {}
    dead: dict[str, str] = {}
    topology = result.topology
    if topology is None:
        raise ValueError("conformance needs a run that recorded its topology")

    def index_of(component: str) -> int:
        c = topology.component(component)
        assert c is not None and c.kind == "client", component
        return c.index

    for ev in result.trace:
        d = ev.detail
        if isinstance(d, ClientSend):
            client_of_uid[d.uid] = index_of(ev.component)
        elif isinstance(d, FeAdd):
            uid_of_inc[ev.inc] = d.uid
        elif isinstance(d, ClientOutput):
            index = index_of(ev.component)
            got = received.setdefault(index, [])
            for child, inc, ctx in d.tokens:
                sender = client_of_uid.get(uid_of_inc.get(inc, -1), -1)
                carried = client_of_uid.get(uid_of_inc.get(ctx, -1), -1) if ctx else -1
                got.append((int(child), sender, carried))
        elif isinstance(d, EngineFatalEvent):
            error = d.error
            kind_of_error = error.split(":", 1)[0].split()[0] if error.strip() else ""
            # the engine, not which of its threads raised
            dead.setdefault(topology.engine_of(ev.component), kind_of_error)
    requests = tuple(RequestView(r.id, r.frontend, r.tokens, r.finish_reason,
                                 _spans(received.get(i, ())))
                     for i, r in enumerate(result.requests))
    seen: dict[str, str] = {}
    for v in result.violations:
        # the runner's books exist only in vLLM's runner: the model never checks them
        if v.invariant not in seen and v.invariant not in RUNNER_INVARIANTS:
            seen[v.invariant] = result.reach(v).reach
    return Outcome(engine or getattr(result, "engine", "model"), result.trace_hash, requests,
                   tuple(seen.items()), tuple(sorted(dead.items())))


def differences(a: Outcome, b: Outcome) -> list[str]:
    """Every way ``b`` differs from ``a``. Each line starts with a key (``finish_reason:client1``,
    ``invariant:no-hang``, ``engine-death:engine``...) that the known-mismatch table matches,
    then what each side had."""
    out: list[str] = []
    if len(a.requests) != len(b.requests):
        return [f"requests: {len(a.requests)} != {len(b.requests)}"]
    for i, (x, y) in enumerate(zip(a.requests, b.requests, strict=True)):
        who = f"client{i}"
        if x.finish_reason != y.finish_reason:
            out.append(f"finish_reason:{who} ({x.id}) {x.finish_reason} != {y.finish_reason}")
        if x.tokens != y.tokens:
            out.append(f"tokens:{who} ({x.id}) {x.tokens} != {y.tokens}")
        if x.received != y.received and x.tokens == y.tokens:
            out.append(f"received:{who} ({x.id}) {_show(x.received)} != {_show(y.received)}")
    inv_a, inv_b = dict(a.invariants), dict(b.invariants)
    for name in dict.fromkeys([*inv_a, *inv_b]):
        ra, rb = inv_a.get(name), inv_b.get(name)
        if ra is None or rb is None:
            out.append(f"invariant:{name} {ra or 'holds'} != {rb or 'holds'}")
        elif ra != rb:
            out.append(f"reach:{name} {ra} != {rb}")
    dead_a, dead_b = dict(a.dead_engines), dict(b.dead_engines)
    for comp in dict.fromkeys([*dead_a, *dead_b]):
        if (comp in dead_a) != (comp in dead_b):
            out.append(f"engine-death:{comp} {'dead' if comp in dead_a else 'alive'} != "
                       f"{'dead' if comp in dead_b else 'alive'}")
    return out


def _show(spans: tuple[Span, ...]) -> str:
    return ",".join(f"{n}x c{s}" + (f"/{c}" if c >= 0 else "") + (f"#{k}" if k else "")
                    for k, s, c, n in spans) or "none"
