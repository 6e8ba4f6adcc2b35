"""The catalogue ``racesim list`` shows (and ``--json`` prints): bundled scenarios, corpus
entries, policies, await points with their width in a vLLM profile, invariants and the vLLM
version profiles with what each backend runs of them."""

from __future__ import annotations

from typing import Any

from racesim.engine_model import INVARIANTS, POINTS, POLICIES
from racesim.engine_model.versions import DEFAULT_VLLM, MID_STEP_WIDTHS, PROFILES, get_profile
from racesim.scenarios import bundled_names, corpus_names, load_scenario

__all__ = ["SECTIONS", "listing"]

#: what ``racesim list WHAT`` takes, in the order the sections print
SECTIONS = ("scenarios", "corpus", "policies", "points", "invariants", "versions")


def listing(what: str | None, vllm: str | None,
            engine: str = "model") -> dict[str, list[dict[str, Any]]]:
    """The section ``what`` (None: all of them), each a list of rows with at least ``name`` and
    ``meaning``; await points carry their ``width`` in the profile ``vllm``. ``engine="vllm"``
    with ``what="points"``: the points of the installed vLLM's own frontend, read from its
    code."""
    profile = get_profile(vllm)
    sections: dict[str, list[dict[str, Any]]] = {}
    if engine == "vllm" and what == "points":
        from racesim.engine_vllm.frontend.points import catalogue

        _release, rows = catalogue()
        sections["points"] = [{**r, "meaning": f"{r['meaning']} (line {r['line']})"
                               if r["line"] else r["meaning"]} for r in rows]
        return sections
    if what in (None, "scenarios"):
        sections["scenarios"] = [{"name": n, "meaning": load_scenario(n).summary}
                                 for n in bundled_names()]
    if what in (None, "corpus"):
        sections["corpus"] = [_corpus_row(n) for n in corpus_names()]
    if what in (None, "policies"):
        sections["policies"] = [{"name": n, "meaning": f"{c.summary} [{c.source}]"}
                                for n, c in POLICIES.items()]
    if what in (None, "points"):
        sections["points"] = [{"name": p.name, "width": profile.width(p.name),
                               **({"width_mid_step": MID_STEP_WIDTHS[p.name]}
                                  if p.name in MID_STEP_WIDTHS else {}),
                               "meaning": p.meaning + (f" (default: {p.natural})"
                                                       if p.natural != "0" else "")}
                              for p in POINTS]
    if what in (None, "invariants"):
        sections["invariants"] = [{"name": n, "meaning": m} for n, m in INVARIANTS.items()]
    if what in (None, "versions"):
        sections["versions"] = _versions_rows()
    return sections


def _corpus_row(name: str) -> dict[str, Any]:
    info = load_scenario(name).corpus
    assert info is not None  # corpus files are checked to carry [corpus] (tests)
    judged = info.invariant if info.target("vllm")[0] == info.invariant else \
        f"vllm: {info.target('vllm')[0]}; model: {info.invariant}"
    return {"name": name, "issue": info.issue, "fix_pr": info.fix_pr, "fix_kind": info.fix_kind,
            "buggy_release": info.buggy_release, "fixed_release": info.fixed_release,
            "invariant": info.invariant, "vllm_invariant": info.target("vllm")[0],
            "meaning": f"#{info.issue} ({info.fix_text}): {info.title} "
                       f"[{info.buggy_release} -> {info.fixed_release}, {judged}]"}


def _versions_rows() -> list[dict[str, Any]]:
    """One row per profile: its release, what each backend runs of it, and the install state
    (read from package metadata, without importing vLLM)."""
    from racesim.engine_model.versions import RELEASE_OF
    from racesim.engine_vllm._api import release_key
    from racesim.engine_vllm.frontend.select import REAL_FRONTEND
    from racesim.engine_vllm.runner.kind import RUNNER_NOTE, runner_kind
    from racesim.runner.engines import SUPPORTED_VLLM, install_command, installed_vllm

    installed = installed_vllm()
    rows = []
    for v in PROFILES.values():
        release = RELEASE_OF.get(v.name, f"{v.name}.x (main at f90d34b)")
        backend = v.name in SUPPORTED_VLLM
        real = REAL_FRONTEND.get(v.name)
        here = backend and installed is not None and \
            (installed == release or installed.startswith(f"{v.name}."))
        state = ("installed" if here else f"not installed: {install_command(release)}"
                 ) if backend else "model only"
        runner = runner_kind(release_key(release)) if backend else None
        tag = (f"[release {release}; model: yes; vllm backend: "
               f"{'yes' if backend else 'no'} ({state}); vLLM's own frontend: "
               + (f"{real}, the default on the vllm backend" if real
                  else "no (the model's frontend)" if backend else "no")
               + (f"; vllm backend's runner: {RUNNER_NOTE[runner]}" if runner else "") + "] ")
        rows.append({"name": v.name, "release": release, "model": True, "vllm_backend": backend,
                     "installed": here, "vllm_frontend": real is not None,
                     "vllm_runner": runner,
                     "meaning": tag + v.release + (" (default)" if v.name == DEFAULT_VLLM
                                                   else ""),
                     "behaviours": [{"text": b.text, "source": b.source} for b in v.behaviours]})
    return rows
