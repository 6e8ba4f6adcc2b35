"""The checks behind every scenario key: each value's kind, range and choices, the requests, the
plans and the ``[corpus]`` table, and the one-line error a failed check becomes
(``<source>:<line>: <key>: <problem> (got <value>)``). loader.py runs them in order.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from racesim.engine_model.config import (
    TOPOLOGIES,
    EngineConfig,
    FrontendConfig,
    IpcConfig,
    PDConfig,
    RequestSpec,
    Workload,
)
from racesim.engine_model.invariants import INVARIANTS
from racesim.engine_model.points import POINTS
from racesim.engine_model.policies import POLICIES
from racesim.engine_model.versions import ALIASES, PROFILES
from racesim.scenarios._toml_writer import locate_key, toml_key
from racesim.scenarios.limits import MAX_PLAN_ENTRIES, MAX_REQUESTS, MAXIMUM
from racesim.scenarios.scenario import CorpusInfo, PlanEntry
from racesim.sim.errors import InputError
from racesim.sim.points import plan_entries

__all__ = ["MAX_REQUEST_ID", "TABLES", "Bad", "check_consistent", "check_corpus",
           "check_fits", "check_plan", "check_requests", "check_table", "check_value",
           "input_error", "key_text", "show"]

KeyPath = tuple[object, ...]

TABLES: dict[str, type] = {"engine": EngineConfig, "ipc": IpcConfig, "frontend": FrontendConfig,
                           "pd": PDConfig}
#: a vLLM release as pip names it: "0.20.0", "0.10.1.1"
_RELEASE = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
#: Smallest allowed value per key, and whether it is excluded; other numbers must be >= 0.
_MINIMUM: dict[str, tuple[float, bool]] = {
    "horizon": (0, True), "frontends": (1, False), "engine.step_time": (0, True),
    **{f"engine.{k}": (1, False)
       for k in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                 "num_speculative_tokens")},
    "frontend.output_chunk_size": (1, False), "engine.data_parallel_size": (1, False),
    "engine.pipeline_parallel_size": (1, False),
    **{f"request.{k}": (1, False) for k in ("prompt_tokens", "max_tokens", "n", "eos_at",
                                            "stop_string_at", "disconnect_after_tokens",
                                            "chunk_tokens")},
}
_CHOICES: dict[str, tuple[str, ...]] = {"topology": TOPOLOGIES, "pd.proxy_ids": ("client", "uuid"),
                                        "pd.connector": ("nixl-pull", "nixl-push", "mooncake"),
                                        "pd.proxy": ("engine-client", "http"),
                                        "pd.endpoints": ("completions-chat",),
                                        "engine.vllm": (*PROFILES, *ALIASES),
                                        "engine.pause_mode": ("abort", "keep"),
                                        "engine.kv_load_failure_policy": ("fail", "recompute"),
                                        "request.endpoint": ("chat", "completions",
                                                             "generate-tokens", "responses"),
                                        "request.id_via": ("header", "body", "none"),
                                        "request.abort_names": ("served", "bare")}
_INT_LIMIT = 2**63 - 1  # TOML integers are 64-bit
#: The longest request ID a scenario may use (README "Scenario files").
MAX_REQUEST_ID = 256
_NO_VALUE = object()

# --------------------------------------------------------------------------- errors

class Bad(Exception):
    """A semantic error at a key path, turned into an InputError once the source is known."""

    def __init__(self, path: KeyPath, problem: str, value: object = _NO_VALUE,
                 *, raw: bool = False) -> None:
        super().__init__(problem)
        self.path, self.problem, self.value, self.raw = path, problem, value, raw


def show(value: object) -> str:
    """A short, one-line repr that never raises (huge ints refuse ``repr``)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _path_text(path: KeyPath) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            key = toml_key(seg) if isinstance(seg, str) else show(seg)
            out += f".{key}" if out else key
    return out


def input_error(source: str, text: str | None, bad: Bad) -> InputError:
    line = locate_key(text, bad.path)
    where = source if line is None else f"{source}:{line}"
    got = "" if bad.value is _NO_VALUE else f" (got {show(bad.value)})"
    if bad.raw or not bad.path:
        return InputError(f"{where}: {bad.problem}{got}")
    return InputError(f"{where}: {_path_text(bad.path)}: {bad.problem}{got}")



# --------------------------------------------------------------------------- validation

def _kind(f: dataclasses.Field[Any]) -> tuple[str, bool]:
    """``(kind, optional)`` of a config field from its (string) annotation."""
    ann = str(f.type).replace(" ", "")
    optional = "None" in ann.split("|")
    base = next((p for p in ann.split("|") if p != "None"), "")
    if base not in ("int", "float", "bool", "str"):
        base = type(f.default).__name__
    return base, optional


def _number(v: object, kind: str, path: KeyPath, rule: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (
            kind == "int" and not isinstance(v, int)):
        raise Bad(path, "must be an integer" if kind == "int" else "must be a number", v)
    if isinstance(v, int) and abs(v) > _INT_LIMIT:
        raise Bad(path, "is out of range (TOML integers are 64-bit)", v)
    num: int | float = int(v) if kind == "int" else float(v)
    if not math.isfinite(num):
        raise Bad(path, "must be finite", v)
    low, strict = _MINIMUM.get(rule, (0, False))
    if num < low or (strict and num == low):
        raise Bad(path, f"must be {'>' if strict else '>='} {low}", v)
    high = MAXIMUM.get(rule)
    if high is not None and num > high:
        raise Bad(path, f"must be <= {high} (racesim's cap; docs/limits.md)", v)
    return num


def check_value(v: object, kind: str, path: KeyPath, rule: str) -> object:
    if kind in ("int", "float"):
        return _number(v, kind, path, rule)
    if kind == "bool":
        if not isinstance(v, bool):
            raise Bad(path, "must be true or false", v)
        return v
    if not isinstance(v, str):
        raise Bad(path, "must be a string", v)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise Bad(path, "must not contain surrogate characters", v)
    choices = _CHOICES.get(rule)
    if choices is not None and v not in choices:
        raise Bad(path, f"must be one of {', '.join(map(repr, choices))}", v)
    return str(v)


def check_table(data: object, path: KeyPath, cls: type, rule: str) -> dict[str, Any]:
    """Check a table against the fields of ``cls``: unknown keys, required keys and values."""
    if not isinstance(data, Mapping):
        raise Bad(path, "must be a table", data)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise Bad((*path, key_text(key)), f"unknown key (allowed: {', '.join(fields)})")
    out: dict[str, Any] = {}
    for name, f in fields.items():
        kind, optional = _kind(f)
        if name in data and not (optional and data[name] is None):
            out[name] = check_value(data[name], kind, (*path, name), f"{rule}.{name}")
        elif name not in data and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise Bad((*path, name), "required key is missing")
    return out


def check_requests(data: object, frontends: int, horizon: float) -> tuple[RequestSpec, ...]:
    if data is None:
        raise Bad(("request",), "at least one [[request]] is required")
    if isinstance(data, (str, bytes)) or not isinstance(data, (list, tuple)):
        raise Bad(("request",), "must be an array of tables ([[request]])", data)
    if not data:
        raise Bad(("request",), "at least one [[request]] is required", data)
    if len(data) > MAX_REQUESTS:
        raise Bad(("request",), f"has {len(data)} entries, more than racesim's cap of "
                  f"{MAX_REQUESTS} (docs/limits.md)")
    out = []
    for i, item in enumerate(data):
        spec = RequestSpec(**check_table(item, ("request", i), RequestSpec, "request"))
        if not spec.id:
            raise Bad(("request", i, "id"), "must be a non-empty string", spec.id)
        if len(spec.id) > MAX_REQUEST_ID:
            raise Bad(("request", i, "id"), f"is {len(spec.id)} characters long, more than "
                      f"{MAX_REQUEST_ID} (vLLM clients send UUIDs and short strings)")
        if spec.at >= horizon:
            raise Bad(("request", i, "at"), f"must be before the horizon ({horizon!r} s): the "
                      f"request would never be sent", spec.at)
        if spec.abort_at is not None and spec.abort_at < spec.at:
            raise Bad(("request", i, "abort_at"), f"must be >= at ({spec.at!r})", spec.abort_at)
        if spec.prompt is not None and (not spec.prompt or spec.prompt.startswith("#")):
            raise Bad(("request", i, "prompt"), "must be a non-empty name not starting with "
                      "'#' (an unnamed prompt is the request's own)", spec.prompt)
        if spec.cancel_at is not None and spec.cancel_at < spec.at:
            raise Bad(("request", i, "cancel_at"), f"must be >= at ({spec.at!r})", spec.cancel_at)
        if spec.frontend >= frontends:
            raise Bad(("request", i, "frontend"),
                      f"must be < frontends ({frontends}); frontends are numbered from 0",
                      spec.frontend)
        out.append(spec)
    return tuple(out)


def check_fits(workload: Workload) -> None:
    """A request that can never fit the KV pool would only deadlock the engine."""
    engine = workload.engine
    for i, spec in enumerate(workload.requests):
        need = -(-(spec.prompt_tokens + spec.max_tokens) // engine.block_size)
        if need > engine.num_blocks:
            raise Bad(("request", i, "max_tokens"),
                      f"prompt_tokens + max_tokens needs {need} KV blocks of "
                      f"{engine.block_size} tokens, more than engine.num_blocks "
                      f"({engine.num_blocks}): it could never finish", spec.max_tokens)


def check_consistent(workload: Workload) -> None:
    """Settings that only make sense together."""
    engine = workload.engine
    if engine.dp_size > 1 and workload.topology != "single":
        raise Bad(("engine", "data_parallel_size"), "data parallelism is modelled for "
                  'topology = "single" only', engine.data_parallel_size)
    if engine.resume_at is not None and (engine.pause_at is None
                                         or engine.resume_at < engine.pause_at):
        raise Bad(("engine", "resume_at"), "needs engine.pause_at <= resume_at",
                  engine.resume_at)
    if engine.pause_clear_cache is not None and engine.pause_at is None:
        raise Bad(("engine", "pause_clear_cache"), "needs engine.pause_at",
                  engine.pause_clear_cache)
    if engine.ft_retry_after is not None and not engine.fault_tolerance:
        raise Bad(("engine", "ft_retry_after"), "needs engine.fault_tolerance = true",
                  engine.ft_retry_after)
    if engine.fault_tolerance and workload.frontends > 1:
        # config/parallel.py:530-535 (vLLM 0.33): one API server only
        raise Bad(("engine", "fault_tolerance"), "needs frontends = 1 (vLLM refuses fault "
                  "tolerance with more than one API server)", True)
    for i, spec in enumerate(workload.requests):
        if spec.endpoint is None:
            for key, default in (("id_via", "header"), ("abort_names", "served"),
                                 ("kv_rejected", False)):
                if getattr(spec, key) != default:
                    raise Bad(("request", i, key), "needs request.endpoint (the API layer)",
                              getattr(spec, key))
        elif workload.topology != "single":
            # the P/D proxy forwards IDs itself (its own helper models it)
            raise Bad(("request", i, "endpoint"), 'the API layer is modelled for topology = '
                      '"single" only', spec.endpoint)
        if spec.unserializable and workload.topology != "single":
            raise Bad(("request", i, "unserializable"), 'needs topology = "single"', True)
        if spec.dp_rank is not None and not spec.dp_rank < engine.dp_size:
            raise Bad(("request", i, "dp_rank"), f"must be < engine.data_parallel_size "
                      f"({engine.dp_size}); ranks are numbered from 0", spec.dp_rank)
        if spec.kv_load_fails and workload.topology != "pd":
            raise Bad(("request", i, "kv_load_fails"), 'needs topology = "pd"', True)
        if spec.kv_load_fails and workload.pd.connector == "mooncake":
            # a pull's failure is not scripted for Mooncake: the fault would be ignored
            raise Bad(("request", i, "kv_load_fails"), 'needs [pd] connector = "nixl-pull" or '
                      '"nixl-push"', True)
        if spec.input_chunks and (workload.topology != "single" or spec.n > 1
                                  or spec.stop_string_at is not None):
            # async_llm.py:713-724 refuses n > 1 and stop strings; the P/D proxy has no
            # streaming input
            raise Bad(("request", i, "input_chunks"), 'needs topology = "single", n = 1 and '
                      "no stop_string_at", spec.input_chunks)
        if spec.chunk_tokens is not None and not spec.input_chunks:
            raise Bad(("request", i, "chunk_tokens"), "needs input_chunks >= 1 (the session's "
                      "later input chunks)", spec.chunk_tokens)


def key_text(key: object) -> str:
    """A table key for error paths (a dict given to scenario_from_dict may have any keys)."""
    return key if isinstance(key, str) else show(key)


def check_plan(data: object, name: str) -> tuple[PlanEntry, ...]:
    """A [delays]/[witness] table as plan entries, checked against the await-point catalogue."""
    if data is None:
        return ()
    if not isinstance(data, Mapping):
        raise Bad((name,), 'must be a table of "point" or "point#K" = seconds', data)
    if len(data) > MAX_PLAN_ENTRIES:
        raise Bad((name,), f"has {len(data)} entries, more than racesim's cap of "
                  f"{MAX_PLAN_ENTRIES} (docs/limits.md)")
    out: list[PlanEntry] = []
    seen: set[tuple[str, int | None]] = set()
    for key, value in data.items():
        if not isinstance(key, str):
            raise Bad((name, key_text(key)), "keys must be strings")
        try:
            entry = plan_entries({key: value}, POINTS, name)[0]
        except InputError as e:
            raise Bad((name, key), str(e), raw=True) from None
        if entry[:2] in seen:
            raise Bad((name, key), "is given twice (same point and occurrence)")
        seen.add(entry[:2])
        out.append(entry)
    return tuple(out)


def check_corpus(data: object, has_plans: bool) -> CorpusInfo | None:
    """A ``[corpus]`` table: the entry's bug, with no hint (no [witness], no [delays])."""
    if data is None:
        return None
    if has_plans:
        raise Bad(("corpus",), "a corpus entry has no [witness] and no [delays]: racesim "
                  "corpus explores it with no hint")
    out = check_table(data, ("corpus",), CorpusInfo, "corpus")
    fix_kind = out.get("fix_kind", "fix")
    if fix_kind not in ("fix", "guard", "open"):
        raise Bad(("corpus", "fix_kind"), 'must be "fix", "guard" or "open"', fix_kind)
    if out["issue"] < 1:
        raise Bad(("corpus", "issue"), "must be a vLLM issue or PR number (>= 1)", out["issue"])
    # an open bug may have no proposed fix yet (0)
    if out["fix_pr"] < (0 if fix_kind == "open" else 1):
        raise Bad(("corpus", "fix_pr"), "must be a vLLM issue or PR number (>= 1"
                  + (', or 0 for none when fix_kind is "open")' if fix_kind == "open" else ")"),
                  out["fix_pr"])
    for key in ("buggy_release", "fixed_release"):
        if key == "fixed_release" and fix_kind == "open":
            if out[key] != "open":
                raise Bad(("corpus", key), 'must be "open" for an open bug (fix_kind = "open")',
                          out[key])
        elif not _RELEASE.fullmatch(out[key]):
            raise Bad(("corpus", key), 'must be a vLLM release such as "0.20.0"'
                      + (' (or "open" with fix_kind = "open")' if key == "fixed_release" else ""),
                      out[key])
    if out["invariant"] not in INVARIANTS:
        raise Bad(("corpus", "invariant"), f"must be one of {', '.join(INVARIANTS)}",
                  out["invariant"])
    vllm_inv = out.get("vllm_invariant", "")
    if vllm_inv and vllm_inv not in INVARIANTS:
        raise Bad(("corpus", "vllm_invariant"), f"must be one of {', '.join(INVARIANTS)} or "
                  f"left out", vllm_inv)
    if out.get("vllm_symptom") and not vllm_inv:
        raise Bad(("corpus", "vllm_symptom"), "needs vllm_invariant (symptom is the text of "
                  "invariant's violation)", out["vllm_symptom"])
    for key in ("title", "description"):
        if not out[key].strip():
            raise Bad(("corpus", key), "must not be empty", out[key])
    policy = out.get("policy", "")
    if policy and policy not in POLICIES:
        raise Bad(("corpus", "policy"), f"must be a built-in policy "
                  f"({', '.join(POLICIES)}) or left out", policy)
    return CorpusInfo(**out)
