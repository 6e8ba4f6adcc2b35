"""One API server: vLLM's own ``AsyncLLM`` (0.33.0 / 0.20.0 v1/engine/async_llm.py) on a
:class:`SimLoop`, with its real ``AsyncMPClient``, ``OutputProcessor`` and request-ID assignment.

It is built as ``vllm serve --api-server-count N`` builds each API server: on the external-engine
path (``client_addresses``, core_client.py ``MPClient.__init__``), so no engine process is
launched. The only names replaced are module globals of ``vllm.v1.engine.core_client`` (the socket
factory, ``zmq``, ``uuid``) and of the ID module (``random_uuid``), and ``time`` in the input
processor (the arrival stamp), each with a seeded or virtual stand-in (research/asyncio.md).

The trace is read from vLLM's state, not from what its calls return: each call into the
``OutputProcessor`` (``add_request``, ``abort_requests``, ``process_outputs``,
``propagate_error``) is wrapped on the instance, and after it the adapter diffs
``request_states`` (by object), so a state vLLM drops without an ABORT shows as a pop. Each
registered ``RequestState`` is bound, by object, to the incarnation and client the adapter gave it
when it appeared (ground truth vLLM never reads).
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections import deque
from typing import Any

import msgspec

from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAbortNoop,
    FeAdd,
    FeDrop,
    FeError,
    FePop,
    FeStats,
)
from racesim.engine_vllm.frontend import _OrderedIds
from racesim.engine_vllm.frontend.loop import SimLoop
from racesim.engine_vllm.frontend.wire import (
    AbortMessage,
    AddTruth,
    EngineCoreRequest,
    FakePull,
    FakeRouter,
    UtilityMessage,
)

__all__ = ["RealFrontend", "RealOutputView"]

#: the client whose task is running (set by the client's task; inherited by the tasks vLLM
#: creates inside its calls)
CALLER: contextvars.ContextVar[Any] = contextvars.ContextVar("racesim_caller", default=None)

_ADD, _ABORT, _UTILITY = b"\x00", b"\x01", b"\x03"


class _Bound:
    """What a RequestState is, in ground truth."""

    __slots__ = ("state", "inc", "uid", "rid")

    def __init__(self, state: Any, inc: int, uid: int, rid: str) -> None:
        self.state = state
        self.inc = inc
        self.uid = uid
        self.rid = rid


class RealOutputView:
    """What the leak audit reads of a frontend (``FrontendState``'s audit methods), from the
    real ``OutputProcessor``."""

    def __init__(self, fe: RealFrontend) -> None:
        self.fe = fe

    def live_ids(self) -> list[tuple[str, int]]:
        fe = self.fe
        return [(rid, fe.inc_of_state(s)) for rid, s in fe.op.request_states.items()]

    def orphan_parents(self) -> list[tuple[str, int]]:
        op = self.fe.op
        held = {id(s.parent_req) for s in op.request_states.values() if s.parent_req is not None}
        return [(pid, self.fe.parent_incs.get(id(p), 0))
                for pid, p in op.parent_requests.items() if id(p) not in held]

    def orphan_external_ids(self) -> list[str]:
        op = self.fe.op
        ext = self.fe.v.api.external_req_ids(op)
        return [e for e, ids in ext.items()
                if not any(r in op.request_states or r in op.parent_requests for r in ids)]


class RealFrontend:
    """One API server process: its AsyncLLM, its sockets, and the trace of its state."""

    dp = None
    engine_dead: str | None = None
    #: the run is over: vLLM's cleanup (closing coroutines) is no longer traced or sent
    closed = False
    #: the server is starting (:meth:`start_serving`): its sends are answered outside the run
    starting = False

    def __init__(self, system: Any, index: int, name: str, engine: Any, loop: SimLoop,
                 count: int) -> None:
        from racesim.engine_vllm.frontend import build

        self.system = system
        self.world = system.world
        self.index = index
        self.name = name
        self.engine = engine.index
        self.engines = (engine.index,)
        self.input_channels: dict[int, Any] = {}
        self.input_channel: Any = None  # set by the System
        self.loop = loop
        self.v = build.vllm_names()
        self.router = FakeRouter(loop, self)
        self.pull = FakePull(loop)
        #: what the next ADD sends carry (one per OutputProcessor.add_request, in order)
        self._pending: deque[tuple[str, AddTruth]] = deque()
        self._bound: dict[int, _Bound] = {}
        #: id(ParentRequest) -> the first child's incarnation (the leak audit names it so)
        self.parent_incs: dict[int, int] = {}
        #: the client of each client task (the task that calls into vLLM is the client's)
        self.clients: dict[Any, Any] = {}
        self._encoder = self.v.MsgpackEncoder()
        self.llm = build.async_llm(self, count)
        self.op = self.llm.output_processor
        self.output_processor = RealOutputView(self)
        self._wrap(self.op)

    # -- ground truth ---------------------------------------------------------------------------

    def inc_of_state(self, state: Any) -> int:
        b = self._bound.get(id(state))
        return b.inc if b is not None and b.state is state else 0

    def _client(self) -> Any:
        """The client whose call this is: its task's, or, for a task vLLM created inside a
        client's call (a streaming session's ``handle_inputs``), the client it was created by
        (asyncio copies the context into a new task)."""
        task = asyncio.current_task(self.loop)
        found = self.clients.get(task)
        return found if found is not None else CALLER.get()

    # -- the OutputProcessor, wrapped on the instance ------------------------------------------

    def _wrap(self, op: Any) -> None:
        real_add, real_abort = op.add_request, op.abort_requests
        real_process, real_error = op.process_outputs, op.propagate_error
        world = self.world
        name = self.name
        states = op.request_states

        def add_request(request: Any, *args: Any, **kw: Any) -> Any:
            if self.closed:
                return real_add(request, *args, **kw)
            before = dict(states)
            parent = args[1] if len(args) > 1 else kw.get("parent_req")
            if parent is not None and not isinstance(parent.child_requests, _OrderedIds):
                # a set of strings, whose order (PYTHONHASHSEED) decides the order of an
                # abort's children (output_processor.py abort_requests): pinned, sorted
                ordered = _OrderedIds()
                for rid in sorted(parent.child_requests):
                    ordered.add(rid)
                parent.child_requests = ordered
            result = real_add(request, *args, **kw)
            client = self._client()
            rid = request.request_id
            old = before.get(rid)
            held = self._bound.get(id(old)) if old is not None else None
            # a session's own later chunk (or its final add) continues its incarnation, as
            # the model's session sends it; another client's add of a held ID is a new one
            own = (held is not None and held.state is old and client is not None
                   and held.uid == client.uid)
            inc = held.inc if own and held is not None else self.system.next_inc()
            uid = client.uid if client is not None else 0
            if client is not None:
                client.accepted = True  # add_request registered it (the model's "accepted")
            spec = client.spec if client is not None else None
            # a scripted preprocessing fault is the engine's (its input thread raises while
            # preprocessing the ADD): it rides beside the frames, as the model's ADD carries it
            self._pending.append((rid, AddTruth(
                inc, uid, spec.eos_at if spec is not None else None,
                (spec.prompt if spec is not None and spec.prompt is not None else f"#{uid}"),
                "preprocess" if spec is not None and spec.preprocess_error else "")))
            state = states.get(rid)
            external = getattr(request, "external_req_id", None) or rid
            if state is not None and state is not old:
                self._bound[id(state)] = _Bound(state, inc, uid, rid)
                if parent is not None:
                    self.parent_incs.setdefault(id(parent), inc)
                index = args[2] if len(args) > 2 else kw.get("request_index", 0)
                if old is not None:
                    self._popped(old, "stream-finished")
                world.emit(name, rid, inc, FeAdd(uid, external, int(index or 0)))
            else:
                # vLLM took it as the held state's streaming update (0.20+
                # output_processor.py add_request): this ADD is never registered, and a
                # non-resumable one finishes the held state (_finish_request, STREAM_FINISHED)
                if not own:
                    world.emit(name, rid, inc, FeAdd(uid, external, 0, tracked=False))
                self._diff(before, "stream-finished")
            return result

        def abort_requests(request_ids: Any, *args: Any, **kw: Any) -> Any:
            if self.closed:
                return real_abort(request_ids, *args, **kw)
            before = dict(states)
            ids = real_abort(request_ids, *args, **kw)
            asked = list(request_ids)
            if not ids:
                world.emit(name, asked[0] if asked else None, 0, FeAbortNoop())
            else:
                incs = [self.inc_of_state(before[r]) for r in ids if r in before]
                world.emit(name, asked[0] if len(asked) == 1 else None,
                           incs[0] if len(incs) == 1 else 0, FeAbortIssue(list(ids), "abort"))
            self._diff(before, "abort")
            return ids

        def process_outputs(outputs: Any, *args: Any, **kw: Any) -> Any:
            if self.closed:
                return real_process(outputs, *args, **kw)
            before = dict(states)
            for out in outputs:
                if out.request_id not in before:
                    fin = out.finish_reason
                    world.emit(name, out.request_id, 0,
                               FeDrop(len(out.new_token_ids), str(fin) if fin is not None
                                      else None))
            result = real_process(outputs, *args, **kw)
            to_abort = list(result.reqs_to_abort or ())
            if to_abort:
                world.emit(name, to_abort[0] if len(to_abort) == 1 else None, 0,
                           FeAbortIssue(to_abort, "stop-string"))
            finish = {o.request_id: o.finish_reason for o in outputs}
            for rid, state in before.items():
                if states.get(rid) is not state:
                    b = self._bound.get(id(state))
                    fin = finish.get(rid)
                    reason = str(fin) if fin is not None else "stop"
                    if b is not None:
                        world.emit(name, rid, b.inc, FeStats(reason, b.uid))
                    self._popped(state, "stop-string" if rid in to_abort else "finished")
            return result

        def propagate_error(exc: Exception) -> Any:
            if self.closed:
                return None
            for rid, state in list(states.items()):
                b = self._bound.get(id(state))
                if b is not None:
                    world.emit(name, rid, b.inc, FeError(b.uid, rid))
            return real_error(exc)

        op.add_request = add_request
        op.abort_requests = abort_requests
        op.process_outputs = process_outputs
        op.propagate_error = propagate_error

    def _diff(self, before: dict[str, Any], why: str) -> None:
        states = self.op.request_states
        for rid, state in before.items():
            if states.get(rid) is not state:
                self._popped(state, why)

    def _popped(self, state: Any, why: str) -> None:
        b = self._bound.pop(id(state), None)
        if b is not None:
            self.world.emit(self.name, b.rid, b.inc, FePop(why))

    # -- start-up -------------------------------------------------------------------------------

    def start_serving(self) -> None:
        """What ``vllm serve`` does before it takes a request: ``build_and_serve`` awaits
        ``engine_client.get_supported_tasks()`` (0.33.0 entrypoints/launchers/api_server/
        entry.py:132; 0.20.0 entrypoints/openai/api_server.py:595; 0.10.1.1 :1607), which caches
        them in the AsyncLLM (0.33.0 async_llm.py:390-395, 0.20.0 :273-278), so no request ever
        waits for that round trip. It runs here, before the run's time 0, with the engine's
        answer handed straight to the PULL socket, as the READY handshake is (wire._Shadow)."""
        task = self.loop.create_task(self.llm.get_supported_tasks(), name="serve:startup")
        self.starting = True
        try:
            self.loop.run_ready()  # runs until nothing is ready: the answer is already waiting
        finally:
            self.starting = False
        if not task.done():
            raise RuntimeError("the API server's start-up call did not complete")
        task.result()

    def answer_startup(self, frames: tuple[bytes, ...]) -> None:
        """The engine's answer to a start-up utility call (engine_side.to_shell's, unrouted)."""
        from racesim.engine_vllm.frontend.engine_side import utility_outputs

        if frames[0] != _UTILITY:
            raise RuntimeError(f"the API server sent {frames[0]!r} while starting")
        _client, call_id, method, _args = self.v.MsgpackDecoder().decode(list(frames[1:]))
        if method != "get_supported_tasks":
            raise RuntimeError(f"the API server called {method!r} while starting")
        real = utility_outputs(self.v, call_id, ("generate",))
        self.pull.deliver([self.v.zmq.Frame(bytes(b)) for b in self._encoder.encode(real)])

    # -- the wire -------------------------------------------------------------------------------

    def classify(self, frames: tuple[bytes, ...]) -> tuple[str, type, Any]:
        """(kind, message class, ground truth) of frames the ROUTER is given."""
        kind = frames[0]
        if kind == _ADD:
            return "ADD", EngineCoreRequest, (self._pending.popleft() if self._pending
                                              else ("", AddTruth(0, 0, None, "")))
        if kind == _ABORT:
            return "ABORT", AbortMessage, self.system.next_inc()
        return "UTILITY", UtilityMessage, None

    def send_wire(self, msg: Any) -> None:
        """The message enters the connection's FIFO pipe (``ipc.input:transit``)."""
        if self.closed:
            return
        if isinstance(msg, EngineCoreRequest):
            rid, truth = msg.truth
            self.input_channel.send(msg, [rid], incs=[truth.inc])
        elif isinstance(msg, AbortMessage):
            ids = [str(r) for r in msgspec.msgpack.decode(msg.frames[1])]
            self.input_channel.send(msg, ids, tag=msg.truth)
        else:
            self.input_channel.send(msg, [])

    def deliver(self, msg: Any) -> None:
        """An engine's message reaches this API server's PULL socket, encoded by vLLM."""
        zmq = self.v.zmq
        real = getattr(msg, "real", None)
        if real is None:  # EngineDead: EngineCoreProc's last words
            frames = [zmq.Frame(self.v.ENGINE_CORE_DEAD)]
            self.engine_dead = getattr(msg, "reason", "dead")
        else:
            frames = [zmq.Frame(bytes(b)) for b in self._encoder.encode(real)]
        self.pull.deliver(frames)


def make_namespace(**kw: Any) -> Any:
    return types.SimpleNamespace(**kw)
