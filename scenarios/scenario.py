"""A validated scenario (:class:`Scenario`, its ``[corpus]`` table) and the TOML it writes back;
reading and checking one is loader.py's (parse_scenario, scenario_from_dict).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from racesim.engine_model.config import FrontendConfig, PDConfig, RequestSpec, Workload
from racesim.engine_model.versions import get_profile
from racesim.scenarios._toml_writer import dumps

__all__ = ["CorpusInfo", "PlanEntry", "Scenario", "scenario_to_toml"]

PlanEntry = tuple[str, int | None, float]
_REQUEST_ALWAYS = ("id", "at", "prompt_tokens", "max_tokens")  # written even when default


@dataclass(frozen=True, slots=True)
class CorpusInfo:
    """A corpus entry's ``[corpus]`` table: the real vLLM bug the scenario reproduces."""

    issue: int
    fix_pr: int
    title: str
    #: the release the bug lived in, and the first one without it ("0.20.0"; "open": none yet)
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
    #: what ``fix_pr`` is: "fix" (the PR fixed this bug), "guard" (the PR brought a guard the
    #: fixed release has, but the threads do not tie it to this issue: "guard present since")
    #: or "open" (the bug is open upstream: ``fixed_release`` is "open", and ``fix_pr`` is a
    #: proposed fix not merged, or 0 for none)
    fix_kind: str = "fix"
    #: the invariant the vllm backend judges, where vLLM's own code shows the bug as another
    #: symptom than the model does (#29355: the model sees the duplicate live ID, vLLM's own
    #: runner the old request's token in the new one's input); "" is ``invariant``
    vllm_invariant: str = ""
    #: ``symptom`` for ``vllm_invariant`` (used only where that is given)
    vllm_symptom: str = ""

    def target(self, engine: str) -> tuple[str, str]:
        """The invariant that shows the bug on ``engine`` ("vllm" or "model") and the text its
        violation must contain ("" for any)."""
        if engine == "vllm" and self.vllm_invariant:
            return self.vllm_invariant, self.vllm_symptom
        return self.invariant, self.symptom

    @property
    def fix_text(self) -> str:
        """``fix_pr`` in words: "fixed by #N", "guard present since #N" or "open"."""
        if self.fix_kind == "open":
            return (f"open; proposed fix #{self.fix_pr} not merged" if self.fix_pr
                    else "open upstream (no fix proposed)")
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

