"""Write a matrix report with one run report per failing cell beside it."""

from __future__ import annotations

from pathlib import Path

from racesim.documents import safe_file_name
from racesim.matrix import MatrixResult
from racesim.runner import replay_command

__all__ = ["write_matrix_reports"]


def write_matrix_reports(path: Path, doc: dict[str, object], result: MatrixResult) -> Path:
    """``path`` gets the matrix; ``<stem>-cells/<scenario>__<policy>.html`` each failing cell."""
    from racesim.reports import write_matrix_report, write_run_report

    cell_dir = path.with_name(path.stem + "-cells")
    links: dict[tuple[str, str], str] = {}
    for cell in result.cells:
        cx, run = cell.counterexample, cell.final_run
        if cx is None or run is None:
            continue
        name = safe_file_name(f"{cell.scenario.name}__{cell.policy}") + ".html"
        command = replay_command(cell.counterexample_path or "")
        write_run_report(cell_dir / name, cx.scenario, cell.policy, dict(cx.options), run,
                         command)
        links[(cell.scenario.name, cell.policy)] = f"{cell_dir.name}/{name}"
    return write_matrix_report(path, doc, links)
