"""Load, validate and write scenario TOML files.

Every user mistake becomes one :class:`~racesim.sim.errors.InputError` line of the form
``<source>:<line>: <key>: <problem> (got <value>)``; nothing else escapes parsing. tomllib
gives line numbers only for syntax errors, so semantic errors are located by scanning the text.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from racesim.engine_model.versions import ALIASES, PROFILES, get_profile
from racesim.scenarios._toml_writer import dumps, locate_key, toml_key
from racesim.scenarios.limits import (
    MAX_NAME,
    MAX_PLAN_ENTRIES,
    MAX_REQUESTS,
    MAXIMUM,
    over_limits,
)
from racesim.sim.errors import InputError
from racesim.sim.points import plan_entries

__all__ = [
    "CorpusInfo",
    "Scenario",
    "MAX_REQUEST_ID",
    "parse_scenario",
    "scenario_from_dict",
    "scenario_to_toml",
]

PlanEntry = tuple[str, int | None, float]
KeyPath = tuple[object, ...]

_TABLES: dict[str, type] = {"engine": EngineConfig, "ipc": IpcConfig, "frontend": FrontendConfig,
                            "pd": PDConfig}
_TOP = ("name", "summary", "topology", "frontends", "horizon", *_TABLES, "request", "delays",
        "witness", "corpus")
#: a vLLM release as pip names it: "0.20.0", "0.10.1.1"
_RELEASE = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
#: Smallest allowed value per key, and whether it is excluded; other numbers must be >= 0.
_MINIMUM: dict[str, tuple[float, bool]] = {
    "horizon": (0, True), "frontends": (1, False), "engine.step_time": (0, True),
    **{f"engine.{k}": (1, False)
       for k in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")},
    "frontend.output_chunk_size": (1, False), "engine.data_parallel_size": (1, False),
    **{f"request.{k}": (1, False) for k in ("prompt_tokens", "max_tokens", "n", "eos_at",
                                            "stop_string_at", "disconnect_after_tokens")},
}
_CHOICES: dict[str, tuple[str, ...]] = {"topology": TOPOLOGIES, "pd.proxy_ids": ("client", "uuid"),
                                        "pd.connector": ("nixl-pull", "nixl-push", "mooncake"),
                                        "pd.proxy": ("engine-client", "http"),
                                        "engine.vllm": (*PROFILES, *ALIASES),
                                        "engine.pause_mode": ("abort", "keep"),
                                        "engine.kv_load_failure_policy": ("fail", "recompute"),
                                        "request.endpoint": ("chat", "completions",
                                                             "generate-tokens", "responses"),
                                        "request.id_via": ("header", "body", "none"),
                                        "request.abort_names": ("served", "bare")}
_REQUEST_ALWAYS = ("id", "at", "prompt_tokens", "max_tokens")  # written even when default
_INT_LIMIT = 2**63 - 1  # TOML integers are 64-bit
#: The longest request ID a scenario may use (README "Scenario files").
MAX_REQUEST_ID = 256
_NO_VALUE = object()


@dataclass(frozen=True, slots=True)
class CorpusInfo:
    """A corpus entry's ``[corpus]`` table: the real vLLM bug the scenario reproduces."""

    issue: int
    fix_pr: int
    title: str
    #: the release the bug lived in, and the first one without it ("0.20.0")
    buggy_release: str
    fixed_release: str
    #: the invariant whose violation shows the bug ("engine-alive")
    invariant: str
    #: what the issue and PR threads say, and how the scenario follows them
    description: str
    #: the lifecycle policy the entry runs under; "" is the one vLLM has on each release
    policy: str = ""
    #: text the violation must contain (vLLM's message or file), so that the same invariant
    #: broken by another bug (say, the duplicate-ID assert) does not count; "" for any
    symptom: str = ""
    #: what ``fix_pr`` is: "fix" (the PR fixed this bug) or "guard" (the PR brought a guard the
    #: fixed release has, but the threads do not tie it to this issue: "guard present since")
    fix_kind: str = "fix"

    @property
    def fix_text(self) -> str:
        """``fix_pr`` in words: "fixed by #N" or "guard present since #N"."""
        return (f"guard present since #{self.fix_pr}" if self.fix_kind == "guard"
                else f"fixed by #{self.fix_pr}")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario. ``source`` (where it came from) does not take part in ``==``."""

    name: str
    summary: str
    workload: Workload
    delays: tuple[PlanEntry, ...]
    witness: tuple[PlanEntry, ...]
    source: str = field(default="<dict>", compare=False)
    #: a ``[witness]`` table was given (it may be empty: a race that needs no delay)
    has_witness: bool = field(default=False, compare=False)
    #: a corpus entry's ``[corpus]`` table (None for any other scenario)
    corpus: CorpusInfo | None = None

    @property
    def vllm(self) -> str:
        """The vLLM profile this scenario runs on (its ``[engine] vllm``, else the default)."""
        return get_profile(self.workload.engine.vllm).name

    def with_vllm(self, vllm: str | None) -> Scenario:
        """The same scenario on another vLLM profile (``--vllm``); None keeps its own."""
        if vllm is None:
            return self
        name = get_profile(vllm).name
        w = self.workload
        return dataclasses.replace(
            self, workload=dataclasses.replace(w, engine=dataclasses.replace(w.engine,
                                                                             vllm=name)))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """How hypothesis's falsifying examples (and IPython) show a scenario: the TOML that
        ``racesim run FILE.toml`` reads, inside the call that parses it back."""
        p.text(f'parse_scenario(r"""\n{scenario_to_toml(self)}""", '
               f'{self.name + ".toml"!r})')

    def to_dict(self) -> dict[str, Any]:
        """The scenario as a TOML-shaped dict; ``scenario_from_dict`` reads it back equal."""
        w = self.workload
        out: dict[str, Any] = {"name": self.name, "summary": self.summary,
                               "topology": w.topology, "frontends": w.frontends,
                               "horizon": w.horizon, "engine": _fields_of(w.engine),
                               "ipc": _fields_of(w.ipc)}
        if w.frontend != FrontendConfig():
            out["frontend"] = _fields_of(w.frontend)
        if w.topology == "pd" or w.pd != PDConfig():
            out["pd"] = _fields_of(w.pd)
        out["request"] = [_request_dict(r) for r in w.requests]
        for key, entries in (("delays", self.delays), ("witness", self.witness)):
            if entries or (key == "witness" and self.has_witness):
                out[key] = {p if k is None else f"{p}#{k}": d for p, k, d in entries}
        if self.corpus is not None:
            out["corpus"] = {k: v for k, v in _fields_of(self.corpus).items()
                             if not (k in ("policy", "symptom") and not v)
                             and not (k == "fix_kind" and v == "fix")}
        return out


def _fields_of(obj: Any) -> dict[str, Any]:
    """The fields that are set: None means "the vLLM profile's default" and is left out."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
            if getattr(obj, f.name) is not None}


def _request_dict(r: RequestSpec) -> dict[str, Any]:
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)
            if f.name in _REQUEST_ALWAYS or getattr(r, f.name) != f.default}


def scenario_to_toml(s: Scenario) -> str:
    """TOML text that :func:`parse_scenario` reads back equal to ``s``."""
    return dumps(s.to_dict())


# --------------------------------------------------------------------------- errors

class _Bad(Exception):
    """A semantic error at a key path, turned into an InputError once the source is known."""

    def __init__(self, path: KeyPath, problem: str, value: object = _NO_VALUE,
                 *, raw: bool = False) -> None:
        super().__init__(problem)
        self.path, self.problem, self.value, self.raw = path, problem, value, raw


def _show(value: object) -> str:
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
            key = toml_key(seg) if isinstance(seg, str) else _show(seg)
            out += f".{key}" if out else key
    return out


def _error(source: str, text: str | None, bad: _Bad) -> InputError:
    line = locate_key(text, bad.path)
    where = source if line is None else f"{source}:{line}"
    got = "" if bad.value is _NO_VALUE else f" (got {_show(bad.value)})"
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
        raise _Bad(path, "must be an integer" if kind == "int" else "must be a number", v)
    if isinstance(v, int) and abs(v) > _INT_LIMIT:
        raise _Bad(path, "is out of range (TOML integers are 64-bit)", v)
    num: int | float = int(v) if kind == "int" else float(v)
    if not math.isfinite(num):
        raise _Bad(path, "must be finite", v)
    low, strict = _MINIMUM.get(rule, (0, False))
    if num < low or (strict and num == low):
        raise _Bad(path, f"must be {'>' if strict else '>='} {low}", v)
    high = MAXIMUM.get(rule)
    if high is not None and num > high:
        raise _Bad(path, f"must be <= {high} (racesim's cap; docs/limits.md)", v)
    return num


def _value(v: object, kind: str, path: KeyPath, rule: str) -> object:
    if kind in ("int", "float"):
        return _number(v, kind, path, rule)
    if kind == "bool":
        if not isinstance(v, bool):
            raise _Bad(path, "must be true or false", v)
        return v
    if not isinstance(v, str):
        raise _Bad(path, "must be a string", v)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise _Bad(path, "must not contain surrogate characters", v)
    choices = _CHOICES.get(rule)
    if choices is not None and v not in choices:
        raise _Bad(path, f"must be one of {', '.join(map(repr, choices))}", v)
    return str(v)


def _table(data: object, path: KeyPath, cls: type, rule: str) -> dict[str, Any]:
    """Check a table against the fields of ``cls``: unknown keys, required keys and values."""
    if not isinstance(data, Mapping):
        raise _Bad(path, "must be a table", data)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise _Bad((*path, _key(key)), f"unknown key (allowed: {', '.join(fields)})")
    out: dict[str, Any] = {}
    for name, f in fields.items():
        kind, optional = _kind(f)
        if name in data and not (optional and data[name] is None):
            out[name] = _value(data[name], kind, (*path, name), f"{rule}.{name}")
        elif name not in data and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise _Bad((*path, name), "required key is missing")
    return out


def _requests(data: object, frontends: int, horizon: float) -> tuple[RequestSpec, ...]:
    if data is None:
        raise _Bad(("request",), "at least one [[request]] is required")
    if isinstance(data, (str, bytes)) or not isinstance(data, (list, tuple)):
        raise _Bad(("request",), "must be an array of tables ([[request]])", data)
    if not data:
        raise _Bad(("request",), "at least one [[request]] is required", data)
    if len(data) > MAX_REQUESTS:
        raise _Bad(("request",), f"has {len(data)} entries, more than racesim's cap of "
                   f"{MAX_REQUESTS} (docs/limits.md)")
    out = []
    for i, item in enumerate(data):
        spec = RequestSpec(**_table(item, ("request", i), RequestSpec, "request"))
        if not spec.id:
            raise _Bad(("request", i, "id"), "must be a non-empty string", spec.id)
        if len(spec.id) > MAX_REQUEST_ID:
            raise _Bad(("request", i, "id"), f"is {len(spec.id)} characters long, more than "
                       f"{MAX_REQUEST_ID} (vLLM clients send UUIDs and short strings)")
        if spec.at >= horizon:
            raise _Bad(("request", i, "at"), f"must be before the horizon ({horizon!r} s): the "
                       f"request would never be sent", spec.at)
        if spec.abort_at is not None and spec.abort_at < spec.at:
            raise _Bad(("request", i, "abort_at"), f"must be >= at ({spec.at!r})", spec.abort_at)
        if spec.prompt is not None and (not spec.prompt or spec.prompt.startswith("#")):
            raise _Bad(("request", i, "prompt"), "must be a non-empty name not starting with "
                       "'#' (an unnamed prompt is the request's own)", spec.prompt)
        if spec.cancel_at is not None and spec.cancel_at < spec.at:
            raise _Bad(("request", i, "cancel_at"), f"must be >= at ({spec.at!r})", spec.cancel_at)
        if spec.frontend >= frontends:
            raise _Bad(("request", i, "frontend"),
                       f"must be < frontends ({frontends}); frontends are numbered from 0",
                       spec.frontend)
        out.append(spec)
    return tuple(out)


def _fits(workload: Workload) -> None:
    """A request that can never fit the KV pool would only deadlock the engine."""
    engine = workload.engine
    for i, spec in enumerate(workload.requests):
        need = -(-(spec.prompt_tokens + spec.max_tokens) // engine.block_size)
        if need > engine.num_blocks:
            raise _Bad(("request", i, "max_tokens"),
                       f"prompt_tokens + max_tokens needs {need} KV blocks of "
                       f"{engine.block_size} tokens, more than engine.num_blocks "
                       f"({engine.num_blocks}): it could never finish", spec.max_tokens)


def _consistent(workload: Workload) -> None:
    """Settings that only make sense together."""
    engine = workload.engine
    if engine.dp_size > 1 and workload.topology != "single":
        raise _Bad(("engine", "data_parallel_size"), "data parallelism is modelled for "
                   'topology = "single" only', engine.data_parallel_size)
    if engine.resume_at is not None and (engine.pause_at is None
                                         or engine.resume_at < engine.pause_at):
        raise _Bad(("engine", "resume_at"), "needs engine.pause_at <= resume_at",
                   engine.resume_at)
    if engine.ft_retry_after is not None and not engine.fault_tolerance:
        raise _Bad(("engine", "ft_retry_after"), "needs engine.fault_tolerance = true",
                   engine.ft_retry_after)
    if engine.fault_tolerance and workload.frontends > 1:
        # config/parallel.py:530-535 (vLLM 0.33): one API server only
        raise _Bad(("engine", "fault_tolerance"), "needs frontends = 1 (vLLM refuses fault "
                   "tolerance with more than one API server)", True)
    for i, spec in enumerate(workload.requests):
        if spec.endpoint is None:
            for key, default in (("id_via", "header"), ("abort_names", "served"),
                                 ("kv_rejected", False)):
                if getattr(spec, key) != default:
                    raise _Bad(("request", i, key), "needs request.endpoint (the API layer)",
                               getattr(spec, key))
        elif workload.topology != "single":
            # the P/D proxy forwards IDs itself (its own helper models it)
            raise _Bad(("request", i, "endpoint"), 'the API layer is modelled for topology = '
                       '"single" only', spec.endpoint)
        if spec.unserializable and workload.topology != "single":
            raise _Bad(("request", i, "unserializable"), 'needs topology = "single"', True)
        if spec.dp_rank is not None and not spec.dp_rank < engine.dp_size:
            raise _Bad(("request", i, "dp_rank"), f"must be < engine.data_parallel_size "
                       f"({engine.dp_size}); ranks are numbered from 0", spec.dp_rank)
        if spec.kv_load_fails and workload.topology != "pd":
            raise _Bad(("request", i, "kv_load_fails"), 'needs topology = "pd"', True)
        if spec.input_chunks and (workload.topology != "single" or spec.n > 1
                                  or spec.stop_string_at is not None):
            # async_llm.py:713-724 refuses n > 1 and stop strings; the P/D proxy has no
            # streaming input
            raise _Bad(("request", i, "input_chunks"), 'needs topology = "single", n = 1 and '
                       "no stop_string_at", spec.input_chunks)


def _key(key: object) -> str:
    """A table key for error paths (a dict given to scenario_from_dict may have any keys)."""
    return key if isinstance(key, str) else _show(key)


def _plan(data: object, name: str) -> tuple[PlanEntry, ...]:
    """A [delays]/[witness] table as plan entries, checked against the await-point catalogue."""
    if data is None:
        return ()
    if not isinstance(data, Mapping):
        raise _Bad((name,), 'must be a table of "point" or "point#K" = seconds', data)
    if len(data) > MAX_PLAN_ENTRIES:
        raise _Bad((name,), f"has {len(data)} entries, more than racesim's cap of "
                   f"{MAX_PLAN_ENTRIES} (docs/limits.md)")
    out: list[PlanEntry] = []
    seen: set[tuple[str, int | None]] = set()
    for key, value in data.items():
        if not isinstance(key, str):
            raise _Bad((name, _key(key)), "keys must be strings")
        try:
            entry = plan_entries({key: value}, POINTS, name)[0]
        except InputError as e:
            raise _Bad((name, key), str(e), raw=True) from None
        if entry[:2] in seen:
            raise _Bad((name, key), "is given twice (same point and occurrence)")
        seen.add(entry[:2])
        out.append(entry)
    return tuple(out)


def _corpus(data: object, has_plans: bool) -> CorpusInfo | None:
    """A ``[corpus]`` table: the entry's bug, with no hint (no [witness], no [delays])."""
    if data is None:
        return None
    if has_plans:
        raise _Bad(("corpus",), "a corpus entry has no [witness] and no [delays]: racesim "
                   "corpus explores it with no hint")
    out = _table(data, ("corpus",), CorpusInfo, "corpus")
    for key in ("issue", "fix_pr"):
        if out[key] < 1:
            raise _Bad(("corpus", key), "must be a vLLM issue or PR number (>= 1)", out[key])
    for key in ("buggy_release", "fixed_release"):
        if not _RELEASE.fullmatch(out[key]):
            raise _Bad(("corpus", key), 'must be a vLLM release such as "0.20.0"', out[key])
    if out["invariant"] not in INVARIANTS:
        raise _Bad(("corpus", "invariant"), f"must be one of {', '.join(INVARIANTS)}",
                   out["invariant"])
    for key in ("title", "description"):
        if not out[key].strip():
            raise _Bad(("corpus", key), "must not be empty", out[key])
    if out.get("fix_kind", "fix") not in ("fix", "guard"):
        raise _Bad(("corpus", "fix_kind"), 'must be "fix" or "guard"', out["fix_kind"])
    policy = out.get("policy", "")
    if policy and policy not in POLICIES:
        raise _Bad(("corpus", "policy"), f"must be a built-in policy "
                   f"({', '.join(POLICIES)}) or left out", policy)
    return CorpusInfo(**out)


_TOP_KINDS = {"name": "str", "summary": "str", "topology": "str", "frontends": "int",
              "horizon": "float"}


def _build(data: object, source: str) -> Scenario:
    if not isinstance(data, Mapping):
        raise _Bad((), "a scenario must be a table of keys", data)
    for key in data:
        if key not in _TOP:
            raise _Bad((_key(key),), f"unknown top-level key (allowed: {', '.join(_TOP)})")
    if "name" not in data:
        raise _Bad(("name",), "required key is missing")
    top: dict[str, Any] = {k: _value(data[k], kind, (k,), k)
                           for k, kind in _TOP_KINDS.items() if k in data}
    if len(top["name"]) > MAX_NAME:
        raise _Bad(("name",), f"is {len(top['name'])} characters long, more than racesim's cap "
                   f"of {MAX_NAME} (files are named after it; docs/limits.md)")
    frontends = int(top.get("frontends", 1))
    tables = {k: cls(**_table(data.get(k, {}), (k,), cls, k)) for k, cls in _TABLES.items()}
    horizon = float(top.get("horizon", 30.0))
    workload = Workload(topology=str(top.get("topology", "single")), frontends=frontends,
                        horizon=horizon, requests=_requests(data.get("request"), frontends,
                                                            horizon), **tables)
    for path, problem, value in over_limits(workload):
        raise _Bad(path, problem, value)
    _fits(workload)
    _consistent(workload)
    return Scenario(name=str(top["name"]), summary=str(top.get("summary", "")),
                    workload=workload, delays=_plan(data.get("delays"), "delays"),
                    witness=_plan(data.get("witness"), "witness"), source=source,
                    has_witness="witness" in data,
                    corpus=_corpus(data.get("corpus"),
                                   "witness" in data or "delays" in data))


def _checked(data: object, source: str, text: str | None) -> Scenario:
    try:
        return _build(data, source)
    except _Bad as bad:
        raise _error(source, text, bad) from None
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    except Exception as e:
        raise InputError(f"{source}: invalid scenario: {type(e).__name__}: {_show(str(e))}") \
            from None


def scenario_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Scenario:
    """Validate a TOML-shaped dict (as :meth:`Scenario.to_dict` makes) into a Scenario."""
    return _checked(data, source, None)


#: a ``[[request]]`` table header at the start of a line (what the early count looks for)
_REQUEST_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*request[ \t]*\]\]", re.MULTILINE)


def _too_many_requests(text: str, source: str) -> None:
    """Refuse a text with more ``[[request]]`` headers than MAX_REQUESTS before parsing it:
    tomllib on a 10 MB file of 100,001 requests takes seconds and 200 MB, only for the count
    to be refused afterwards. A header-like line inside a multi-line string counts too (a
    file that has more than MAX_REQUESTS of them is refused either way in practice)."""
    if text.count("[[", 0) <= MAX_REQUESTS:
        return
    for n, m in enumerate(_REQUEST_HEADER.finditer(text)):
        if n == MAX_REQUESTS:
            line = text.count("\n", 0, m.start()) + 1
            raise InputError(f"{source}:{line}: request: more than {MAX_REQUESTS} [[request]] "
                             f"entries, racesim's cap (docs/limits.md); not parsed further")


def parse_scenario(text: str, source: str) -> Scenario:
    """Parse and validate scenario TOML text; ``source`` names it in error messages."""
    if not isinstance(text, str):
        raise InputError(f"{source}: scenario text must be a string (got {_show(text)})")
    _too_many_requests(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        where = f"{source}:{m.group(1)}" if m else source
        raise InputError(f"{where}: invalid TOML: {e}") from None
    except Exception as e:
        raise InputError(f"{source}: invalid TOML: {_show(str(e))}") from None
    return _checked(data, source, text)
