"""Building vLLM's own AsyncLLM inside a run, and the module seams it needs (set once per process,
pointed at the running World per run).

The seams are module globals vLLM looks up at call time (research/asyncio.md section 2, level 3):

- ``vllm.v1.engine.core_client.make_zmq_socket``: the fake ROUTER / PULL of the API server being
  built (:mod:`racesim.engine_vllm.frontend.wire`);
- ``vllm.v1.engine.core_client.zmq``: pyzmq with no ``Context`` (no I/O threads) and a
  ``Socket.shadow`` that answers the READY handshake;
- ``vllm.v1.engine.core_client.uuid``: ``uuid1`` for utility call IDs, seeded from the World;
- the ID module's ``random_uuid`` (``InputProcessor.assign_request_id``): seeded from the World;
- ``time`` in the input processor (``arrival_time = time.time()``): the World's clock.

Everything else is vLLM's code as released: ``AsyncLLM.__init__``, ``make_async_mp_client``,
``AsyncMPClient``/``MPClient.__init__`` on the ``client_addresses`` branch, which
``launch_core_engines`` never runs on (core_client.py ``MPClient.__init__``).
"""

from __future__ import annotations

import importlib
import os
import types
import uuid as _uuid
from functools import cache
from typing import Any

from racesim.engine_vllm import _vllm

__all__ = ["vllm_names", "async_llm", "bind_run", "set_lifecycle", "restore_env"]


class _Run:
    """The running World (the seams read it at call time) and the API server being built."""

    world: Any = None
    building: Any = None


_RUN = _Run()


def _random_uuid() -> str:
    return f"{_RUN.world.rng.stream('vllm/random_uuid').getrandbits(128):032x}"


def _uuid1() -> _uuid.UUID:
    return _uuid.UUID(int=_RUN.world.rng.stream("vllm/uuid1").getrandbits(128))


class _Clock:
    """``time`` for the input processor: ``time()`` is the World's clock."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def time(self) -> float:
        return float(_RUN.world.now)

    def monotonic(self) -> float:
        return float(_RUN.world.now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _make_zmq_socket(ctx: Any, path: Any, socket_type: Any, *_a: Any, **_k: Any) -> Any:
    fe = _RUN.building
    import zmq

    return fe.router if socket_type == zmq.ROUTER else fe.pull


@cache
def vllm_names() -> Any:
    """vLLM's names the real frontend uses, and the seams installed (once per process)."""
    v = _vllm.vllm()
    import zmq

    from racesim.engine_vllm.frontend.loop import install_sleep0
    from racesim.engine_vllm.frontend.wire import zmq_shim

    cc = importlib.import_module("vllm.v1.engine.core_client")
    al = importlib.import_module("vllm.v1.engine.async_llm")
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    core = importlib.import_module("vllm.v1.engine.core")
    from vllm.v1.engine import EngineCoreRequestType

    cc.make_zmq_socket = _make_zmq_socket
    cc.zmq = zmq_shim(zmq)
    cc.uuid = types.SimpleNamespace(uuid1=_uuid1, uuid4=_uuid1, UUID=_uuid.UUID)
    ids = v.api.id_module()
    if hasattr(ids, "random_uuid"):
        ids.random_uuid = _random_uuid
    for name in ("vllm.v1.engine.input_processor", "vllm.v1.engine.processor",
                 "vllm.renderers.base"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if isinstance(getattr(mod, "time", None), types.ModuleType):
            mod.time = _Clock(mod.time)
    install_sleep0()
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        tokens_input = None
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    try:  # streaming-input sessions (0.20+)
        from vllm.engine.protocol import StreamingInput
    except ImportError:
        StreamingInput = None

    return types.SimpleNamespace(
        api=v.api, version=v.version, AsyncLLM=al.AsyncLLM, zmq=zmq,
        ENGINE_CORE_DEAD=core.EngineCoreProc.ENGINE_CORE_DEAD,
        MsgpackEncoder=MsgpackEncoder, MsgpackDecoder=MsgpackDecoder,
        EngineCoreRequest=v.EngineCoreRequest, EngineCoreOutputs=v.EngineCoreOutputs,
        RequestType=EngineCoreRequestType,
        tokens_input=tokens_input, StreamingInput=StreamingInput, SamplingParams=SamplingParams,
        RequestOutputKind=RequestOutputKind,
        EngineDeadError=v.EngineDeadError)


def bind_run(world: Any) -> None:
    """Point the seams at this run's World."""
    _RUN.world = world


_ENV_KEYS = ("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE")


def set_lifecycle(policy: str, chunk_size: int) -> dict[str, str | None]:
    """``buggy``: the release with ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1``; ``internal-id``:
    as shipped. vLLM's ``envs`` reads the environment at each access (envs.py ``__getattr__``).
    Returns what to restore after the run (:func:`restore_env`)."""
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1" if policy == "buggy" else "0"
    os.environ["VLLM_V1_OUTPUT_PROC_CHUNK_SIZE"] = str(chunk_size)
    return saved


def restore_env(saved: dict[str, str | None]) -> None:
    """Put the environment back: a later run in this process (the other frontend, which calls
    vLLM's assign_request_id too) must not inherit this run's lifecycle."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def async_llm(fe: Any, count: int) -> Any:
    """API server ``fe.index`` of ``count``: the release's AsyncLLM on the external-engine path."""
    names = vllm_names()
    shape = fe.system.engine_shape()
    vc, _spec = _vllm._config(shape)
    if getattr(vc, "observability_config", False) is None:
        # 0.11's VllmConfig defaults it to None; EngineArgs.create_engine_config (what
        # `vllm serve` builds) always sets one, which AsyncLLM.__init__ reads
        from vllm.config import ObservabilityConfig

        vc.observability_config = ObservabilityConfig()
    _RUN.building = fe
    try:
        llm = names.AsyncLLM(
            vllm_config=vc, executor_class=object, log_stats=False, log_requests=False,
            client_addresses={"input_address": "inproc://in", "output_address": "inproc://out"},
            client_count=count, client_index=fe.index)
    finally:
        _RUN.building = None
    from racesim.engine_vllm.engine.views import StopTokenizer

    # the fake vocabulary's detokenizer: a stop string "a" * N ends at the N-th output token
    llm.output_processor.tokenizer = StopTokenizer()
    return llm
