"""Write a matrix report with one run report per failing cell beside it."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from racesim.documents import safe_file_name
from racesim.explore.matrix import MatrixResult
from racesim.runner import replay_command

__all__ = ["write_matrix_reports", "cells_dir", "check_cells_dir"]

#: The file that marks a cell folder as racesim's: only such a folder's files are replaced.
MARKER = ".racesim-cells"


def cells_dir(path: Path) -> Path:
    """Where the matrix report ``path`` puts its failing cells' run reports."""
    return path.with_name(path.stem + "-cells")


def check_cells_dir(path: Path) -> str | None:
    """Why the cell folder of report ``path`` cannot be written (checked before any run, so no
    work is lost), or None. A folder racesim did not create is never written into."""
    folder = cells_dir(path)
    if not (folder.exists() or folder.is_symlink()):
        return None
    if not folder.is_dir():
        return f"{str(folder)!r} (its cell reports' folder) exists and is not a folder"
    if not (folder / MARKER).is_file():
        return (f"{str(folder)!r} (its cell reports' folder) exists and was not written by "
                f"racesim; move it or choose another --html name")
    return None


def write_matrix_reports(path: Path, doc: dict[str, object], result: MatrixResult) -> Path:
    """``path`` gets the matrix; ``<stem>-cells/<scenario>__<policy>.html`` each failing cell.
    Returns the cell folder (which exists only when a cell failed)."""
    from racesim.reports import write_matrix_report, write_run_report
    from racesim.reports.html import cell_anchor

    cell_dir = cells_dir(path)
    links: dict[tuple[str, str], str] = {}
    files: dict[tuple[str, str], str] = {}
    for cell in result.cells:
        cx, run = cell.counterexample, cell.final_run
        key = (cell.scenario.name, cell.policy)
        if cell.counterexample_path:  # relative to the report, wherever the two are
            files[key] = quote(Path(os.path.relpath(Path(cell.counterexample_path).resolve(),
                                                    path.resolve().parent)).as_posix())
        if cx is None or run is None:
            continue
        name = safe_file_name(f"{cell.scenario.name}__{cell.policy}") + ".html"
        command = replay_command(cell.counterexample_path or "")
        back = f"../{path.name}#{cell_anchor(*key)}"
        write_run_report(cell_dir / name, cx.scenario, cell.policy, dict(cx.options), run,
                         command, back=back)
        links[key] = f"{cell_dir.name}/{name}"
    if links:
        (cell_dir / MARKER).write_text("racesim matrix --html writes its failing cells' reports "
                                       "here, and replaces them on the next run\n",
                                       encoding="utf-8")
    write_matrix_report(path, doc, links, files)
    return cell_dir
