"""``racesim bench`` on the terminal: a :func:`racesim.bench.run_bench` document as rich
tables."""

from __future__ import annotations

from typing import Any

__all__ = ["print_bench"]


def print_bench(console: Any, doc: dict[str, Any]) -> None:
    """Render a :func:`run_bench` document as rich tables on ``console``."""
    from rich.table import Table

    def mark(ok: bool) -> str:
        return "[green]yes[/]" if ok else "[red]no[/]"

    summary = Table(title="racesim bench" + (" (quick)" if doc.get("quick") else "")
                    + f", {doc['build']}")
    summary.add_column("figure")
    summary.add_column("measured", justify="right")
    summary.add_column("target", justify="right")
    summary.add_column("met")
    targets = doc["targets"]
    rows = [
        ("simpy_events_per_s", f"{doc['simpy_events_per_s']:,}", None),
        ("model_events_per_s", f"{doc['model_events_per_s']:,}", None),
        ("overhead_ratio", f"{doc['overhead_ratio']:g}", "overhead_ratio"),
        ("schedules_per_s", f"{doc['schedules_per_s']:,}", "schedules_per_s"),
        (f"dp_schedules_per_s ({doc['dp_schedules']['scenario']})",
         f"{doc['dp_schedules_per_s']:,}", None),
        ("first bug, worst scenario's best runs", _fmt(targets["first_bug_best_runs"]["value"]),
         "first_bug_best_runs"),
        *((f"schedules_per_s, {f['scenario']} ({figure}, {f['policy']}, {f['vllm']})",
           f"{f['schedules_per_s']:,}", None) for figure, f in doc["features"].items()),
        ("growth_exponent", f"{doc['scale']['growth_exponent']:g}", "growth_exponent"),
        ("parallel_speedup", f"{doc['parallel_speedup']:g}", "parallel_speedup"),
        ("  two processes' limit now (CPU burn)", f"{doc['parallel']['capacity']:g}", None),
    ]
    for label, value, key in rows:
        if key is None:
            summary.add_row(label, value, "", "")
        else:
            summary.add_row(label, value, targets[key]["target"], mark(targets[key]["met"]))
    vllm = doc.get("vllm") or {}
    if vllm.get("vllm_schedules_per_s") is not None:
        summary.add_row(f"vllm_schedules_per_s ({vllm['scenario']}, {vllm['vllm']}, 1 worker)",
                        f"{vllm['vllm_schedules_per_s']:,}", f">= {vllm['target_per_core']:g}",
                        mark(vllm["vllm_schedules_per_s"] >= vllm["target_per_core"]))
        summary.add_row("  the model, same explore", f"{vllm['model_schedules_per_s']:,}", "", "")
        target = vllm["frontend_target_per_core"]
        for label, key in (("vllm_frontend_schedules_per_s (vLLM's own AsyncLLM too)",
                            "frontend_"),
                           ("vllm_frontend_model_runner_schedules_per_s (vLLM's own AsyncLLM, "
                            "the model's runner)", "frontend_model_runner_")):
            fe, cpu = vllm[key + "schedules_per_s"], vllm[key + "cpu_schedules_per_s"]
            summary.add_row(label, f"{fe:,} ({cpu:,} per CPU s)", f">= {target:g}",
                            mark(cpu >= target))
        for label, key in (("vllm_harness_share (time outside vLLM's code)", "harness_share"),
                           ("  with vLLM's own frontend", "frontend_harness_share")):
            share = vllm.get(key)
            if share is not None:
                summary.add_row(label, f"{share:.0%} ± {vllm[key + '_stderr']:.0%}",
                                f"<= {vllm['harness_target']:.0%}",
                                mark(share <= vllm["harness_target"]))
        summary.add_row("importing vLLM (s)", f"{vllm['import_s']:g}", "", "")
        summary.add_row(f"racesim run {vllm['scenario']} --engine vllm (s)",
                        f"{vllm['run_command_s']:g} ({vllm['run_import_share']:.0%} import)",
                        "", "")
    elif vllm:
        summary.add_row("vllm_schedules_per_s", "unavailable", "", "")
    console.print(summary)
    if vllm.get("unavailable"):
        console.print(f"vLLM backend unavailable: {vllm['unavailable']}", markup=False)

    fb = Table(title="runs / seconds to the first violation under "
                     f"{doc['first_bug_budget']['policy']} "
                     f"(budget {doc['first_bug_budget']['runs']})")
    fb.add_column("scenario")
    strategies = list(next(iter(doc["first_bug"].values()), {}))
    for s in strategies:
        fb.add_column(s, justify="right")
    for name, cells in doc["first_bug"].items():
        fb.add_row(name, *(("-" if c["runs"] is None else f"{c['runs']} / {c['seconds']:.2f}s")
                           for c in (cells[s] for s in strategies)))
    console.print(fb)

    sc = Table(title=f"scale: abort-storm-like load under {doc['scale']['policy']} "
                     f"(growth exponent {doc['scale']['growth_exponent']:g})")
    for col in ("requests", "seconds", "peak RSS MB", "run RSS MB", "KB/request", "events",
                "simpy events"):
        sc.add_column(col, justify="right")
    for r in doc["scale"]["sizes"]:
        sc.add_row(f"{r['requests']:,}", f"{r['seconds']:.2f}", f"{r['peak_rss_mb']:.1f}",
                   f"{r['run_rss_mb']:.1f}", f"{r['run_kb_per_request']:.2f}", f"{r['events']:,}",
                   f"{r['steps']:,}")
    console.print(sc)
    par = doc["parallel"]
    console.print(f"timed figures: best of {doc['repeats']}. "
                  f"parallel: {par['runs']} runs of {par['scenario']} in {par['workers_1_s']}s "
                  f"(1 worker) vs {par['workers_2_s']}s (2 workers); same result: "
                  f"{par['identical']}; two processes could gain at most {par['capacity']}x "
                  f"(CPU burn). machine: {doc['machine']['cpus']} CPUs, Python "
                  f"{doc['machine']['python']}, simpy {doc['machine']['simpy']}, load average "
                  f"{doc['machine']['loadavg_1m']}; bench took {doc['elapsed_s']}s")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v}"
