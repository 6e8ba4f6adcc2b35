"""Lifecycle policies: the buggy abort path and the fixes proposed or merged in vLLM.

A policy decides three things, and nothing else differs between them:

1. the request ID the engine sees (``assign_request_id``);
2. the frontend's abort coroutine (``abort``): when ``request_states`` is dropped relative to the
   await that sends the ABORT;
3. the same for stop-string finishes found by the output handler (``abort_stop_strings`` and
   ``pop_stop_string_finishes``), and whether the engine answers every ABORT with a final
   "abort" output (``engine_final_abort``).

Writing your own
----------------
Subclass :class:`LifecyclePolicy`, set ``name`` and ``summary``, override what differs and run
``racesim run SCENARIO --policy package.module:ClassName``. Options given as
``--policy-opt KEY=VALUE`` reach ``__init__`` as keyword arguments (strings); declare them in
``options`` (name -> help) and validate them, raising :class:`racesim.sim.InputError` on a bad
value.
``abort`` and ``abort_stop_strings`` are simpy process generators; build them from the frontend's
primitives:

- ``llm.output_processor.abort_requests(ids)``: drop the states, give clients their final "abort";
- ``llm.output_processor.mark_finished(ids)``: final "abort" to clients, keep the states;
- ``llm.output_processor.pop_finished(ids)``: drop states kept by ``mark_finished`` or a stop
  string;
- ``yield from llm.send_abort(ids, point)``: pass await point ``point``, then send the ABORT.

Which IDs each hook receives:

- ``assign_request_id(llm, request_id)``: the client's *external* ID; it returns the
  *internal* ID the engine (and every ID-keyed table) will see.
- ``abort(llm, request_ids)``: *internal* IDs. The frontend has already mapped the ID the
  client aborted (external, or internal for a proxy's own abort) to every internal ID live
  under it, children of ``n > 1`` included; IDs it no longer tracks are not passed.
- ``abort_stop_strings(llm, request_ids)``: *internal* IDs of the requests the output handler
  just finished on a stop string.

Pass the required points: ``frontend.abort:after_pop`` in ``abort`` and
``frontend.output_handler:before_abort_send`` in ``abort_stop_strings``, so that schedules stay
comparable across policies.

Keep a policy's own state on the policy (``self``), not on ``llm``: in the compiled build (see
the README) the frontend's classes take no attributes they do not declare. The primitives above
take any sequence of IDs.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import simpy

from racesim.sim.errors import InputError

if TYPE_CHECKING:
    from racesim.engine_model.frontend.async_llm import AsyncLLM

__all__ = ["LifecyclePolicy", "PolicyImportError", "Shipped", "Buggy", "AbortScope",
           "EngineFinal", "InternalId", "POLICIES", "ID_SCHEMES", "id_scheme",
           "release_assigns_ids", "with_ids", "load_policy", "policy_spec"]

Proc = Generator[simpy.Event, Any, None]

ABORT_POINT = "frontend.abort:after_pop"
STOP_POINT = "frontend.output_handler:before_abort_send"


class LifecyclePolicy:
    """The abort ordering every vLLM release ships (0.8 to 0.33: ``AsyncLLM.abort`` pops the
    frontend state, then awaits the ABORT send; 0.33 v1/engine/async_llm.py:955-956, 0.20
    :712-713, 0.14 :559-560, 0.11 :490-491, 0.10.1.1 :440-441): the ordering #15326 reported.
    Every other policy changes part of it. The request-ID scheme is a separate axis
    (``ids``, ``--ids``)."""

    name: ClassVar[str] = "custom"
    summary: ClassVar[str] = ""
    source: ClassVar[str] = ""
    options: ClassVar[Mapping[str, str]] = {}
    #: the request-ID scheme a run uses unless ``--ids`` says otherwise: "release" (the profile's
    #: release's own assignment, what it ships) or "given" (the client's IDs, as with
    #: VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1). A policy that overrides ``assign_request_id``
    #: has its own scheme and takes no ``--ids`` (:func:`id_scheme`).
    ids: ClassVar[str] = "release"
    #: the engine sends EngineCoreOutput(id, [], ABORT) for every request an ABORT ends.
    engine_final_abort: ClassVar[bool] = False
    #: the output handler drops a stop-string finish at once (before its ABORT is sent).
    pop_stop_string_finishes: ClassVar[bool] = True

    def __init__(self, **opts: str) -> None:
        unknown = sorted(set(opts) - set(self.options))
        if unknown:
            known = ", ".join(self.options) or "none"
            raise InputError(f"policy {self.name!r} has no option {unknown[0]!r} "
                             f"(options: {known})")
        self.opts = dict(opts)

    def assign_request_id(self, llm: AsyncLLM, request_id: str) -> str:
        return request_id

    def abort(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        # vLLM #15326: abort pops the frontend state *before* the ABORT is sent.
        llm.output_processor.abort_requests(request_ids)
        yield from llm.send_abort(request_ids, ABORT_POINT)

    def abort_stop_strings(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        # The state was popped in process_outputs; the ABORT follows after an await.
        yield from llm.send_abort(request_ids, STOP_POINT)


class Shipped(LifecyclePolicy):
    """What each release ships: its own abort ordering and, by default, its own request IDs."""

    name = "shipped"
    summary = ("the release as shipped: abort pops frontend state, then awaits the ABORT send; "
               "IDs as the release assigns them (--ids release, the default)")
    source = "every vLLM release 0.8-0.33 (async_llm.py:955-956 in 0.33)"


class Buggy(LifecyclePolicy):
    """``shipped`` with IDs as given: the release's own abort ordering (the one #15326
    reported, which every release 0.8-0.33 still has) and the client's request IDs. On 0.14
    and later that is not the default: 0.20 and 0.33 run so with
    VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1, 0.14 has no such switch."""

    name = "buggy"
    summary = ("IDs as given, abort ordering as the profile's release ships it (pops frontend "
               "state, then awaits the ABORT send): shipped --ids given")
    source = ("each release with the client's IDs: 0.8-0.11 as shipped, 0.20/0.33 with "
              "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 (not 'before #15326': its abort "
              "ordering still ships)")
    ids = "given"


class AbortScope(LifecyclePolicy):
    """PR #15326: send the ABORT first, drop the frontend state after."""

    name = "abort-scope"
    summary = ("send ABORT first, drop frontend state after; frontend visibility always covers "
               "the engine's")
    source = "PR #15326"
    #: IDs as given by default: the tables and counterexample files that name this policy were
    #: made so; ``--ids release`` runs the fix on the release's own IDs
    ids = "given"
    pop_stop_string_finishes = False

    def abort(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        yield from llm.send_abort(request_ids, ABORT_POINT)
        llm.output_processor.abort_requests(request_ids)

    def abort_stop_strings(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        yield from llm.send_abort(request_ids, STOP_POINT)
        llm.output_processor.pop_finished(request_ids)


class EngineFinal(LifecyclePolicy):
    """The engine answers every ABORT with a final output; the frontend drops state then."""

    name = "engine-final"
    summary = ("the engine answers every ABORT with a final 'abort' output; the frontend drops "
               "state only then, and counts the abort in stats")
    source = "njhill's proposal in PR #15326's review"
    ids = "given"  # as abort-scope: --ids release for the release's own IDs
    engine_final_abort = True
    pop_stop_string_finishes = False

    def abort(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        # Nothing is dropped here: the engine's final "abort" output ends the request.
        yield from llm.send_abort(request_ids, ABORT_POINT)

    def abort_stop_strings(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        yield from llm.send_abort(request_ids, STOP_POINT)


class InternalId(LifecyclePolicy):
    """PR #27987: a random suffix makes every internal request ID unique."""

    name = "internal-id"
    summary = ("internal ID = external + '-' + random hex suffix; abort by external ID aborts "
               "all its internal IDs")
    source = "PR #27987"
    options: ClassVar[Mapping[str, str]] = {
        "suffix_hex": "hex characters of random suffix (default 8; 0 disables it, as "
                      "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 does)"}

    def __init__(self, **opts: str) -> None:
        super().__init__(**opts)
        raw = opts.get("suffix_hex", "8")
        if not (raw.isascii() and raw.isdigit()) or not 0 <= int(raw) <= 32:
            raise InputError(f"policy 'internal-id': suffix_hex must be a whole number 0..32, "
                             f"got {raw!r}")
        self.suffix_hex = int(raw)

    def assign_request_id(self, llm: AsyncLLM, request_id: str) -> str:
        # InputProcessor.assign_request_id (#27987): external ID + "-" + random hex.
        if self.suffix_hex == 0:
            return request_id
        rng = llm.world.rng.stream(f"request-id/{llm.name}")
        return f"{request_id}-{rng.getrandbits(4 * self.suffix_hex):0{self.suffix_hex}x}"


POLICIES: dict[str, type[LifecyclePolicy]] = {
    cls.name: cls for cls in (Shipped, Buggy, AbortScope, EngineFinal, InternalId)
}

#: ``--ids``: the client's IDs as given, or the release's own assignment.
ID_SCHEMES = ("given", "release")


def release_assigns_ids(vllm: str) -> bool:
    """Whether the release of profile ``vllm`` replaces the client's ID with an internal one by
    default: from 0.14 (#27987). 0.33 v1/engine/input_processor.py:354-371 and 0.20
    :215-232 append ``-`` + 8 random hex unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION; 0.14
    :434-444 always does (no switch); 0.11 and earlier keep the caller's ID end to end
    (v1/engine/processor.py)."""
    major, _, minor = vllm.partition(".")
    try:
        return (int(major), int(minor.partition(".")[0])) >= (0, 14)
    except ValueError:
        return True  # a name that is no release number: a dev profile, newer than all


def id_scheme(cls: type[LifecyclePolicy], ids: str | None) -> str:
    """The ID scheme a run of ``cls`` uses: ``ids`` when given, else the policy's default;
    "own" for a policy that overrides ``assign_request_id`` (internal-id), which refuses an
    explicit ``ids``."""
    if ids is not None and ids not in (*ID_SCHEMES, "own", "legacy"):
        raise InputError(f"--ids must be one of {', '.join(ID_SCHEMES)}, got {ids!r}")
    own = cls.assign_request_id is not LifecyclePolicy.assign_request_id
    if ids == "legacy":  # a file written before the axis: the policy's own assign_request_id
        return "own" if own else "given"
    if own:
        if ids not in (None, "own"):
            raise InputError(f"policy {cls.name!r} assigns its own request IDs, so it takes no "
                             f"--ids (use -p shipped --ids {ids})")
        return "own"
    return ids if ids is not None else cls.ids


class _ReleaseIds:
    """A policy with the release's own ID assignment (#27987): the external ID + "-" + 8 random
    hex, drawn from the stream ``internal-id`` draws from, so ``shipped`` and ``internal-id``
    give the same trace. Everything else is the wrapped policy's."""

    #: read by the vllm backend, which then calls vLLM's own assign_request_id
    suffix_hex = 8

    def __init__(self, policy: LifecyclePolicy) -> None:
        self._policy = policy
        self.name = policy.name
        self.opts = policy.opts
        self.engine_final_abort = policy.engine_final_abort
        self.pop_stop_string_finishes = policy.pop_stop_string_finishes

    def assign_request_id(self, llm: AsyncLLM, request_id: str) -> str:
        rng = llm.world.rng.stream(f"request-id/{llm.name}")
        return f"{request_id}-{rng.getrandbits(32):08x}"

    def abort(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        return self._policy.abort(llm, request_ids)

    def abort_stop_strings(self, llm: AsyncLLM, request_ids: list[str]) -> Proc:
        return self._policy.abort_stop_strings(llm, request_ids)

    def __getattr__(self, attr: str) -> Any:  # a user policy's own attributes
        return getattr(self._policy, attr)


def with_ids(policy: LifecyclePolicy, scheme: str, vllm: str) -> Any:
    """``policy`` running with ID scheme ``scheme`` (from :func:`id_scheme`) on profile
    ``vllm``: itself for "given" and "own" (its own ``assign_request_id``), else with the
    release's assignment, which before 0.14 is the ID as given."""
    if scheme == "release" and release_assigns_ids(vllm):
        return _ReleaseIds(policy)
    return policy


class PolicyImportError(InputError):
    """A ``module:Class`` policy's module failed to import (on a Dask worker: not shipped)."""


def policy_spec(spec: str) -> type[LifecyclePolicy]:
    """A policy class by registry name or ``package.module:ClassName``."""
    if spec in POLICIES:
        return POLICIES[spec]
    if ":" not in spec:
        raise InputError(f"unknown policy {spec!r} (known: {', '.join(POLICIES)}; or give "
                         f"package.module:ClassName)")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's module, reported in one line
        raise PolicyImportError(f"policy {spec!r}: cannot import module {module_name!r}: "
                                f"{type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, LifecyclePolicy)):
        raise InputError(f"policy {spec!r}: {attr!r} is not a LifecyclePolicy subclass in "
                         f"{module_name!r}")
    return cls


def load_policy(spec: str, options: Mapping[str, str] | None = None) -> LifecyclePolicy:
    """Instantiate a policy by name or ``module:Class`` with its ``--policy-opt`` options."""
    return policy_spec(spec)(**dict(options or {}))
