"""HTML race reports (run, explore, matrix) and Chrome trace-event export (Perfetto).

Every report is one self-contained HTML file: inline CSS and SVG, no script and nothing from
the network, rendered from package templates with autoescaping on (request IDs are user input).
"""

from racesim.reports.html import (
    render_explore_report,
    render_matrix_report,
    render_run_report,
    write_explore_report,
    write_matrix_report,
    write_run_report,
)
from racesim.reports.trace_export import chrome_trace, write_chrome_trace

__all__ = [
    "chrome_trace",
    "render_explore_report",
    "render_matrix_report",
    "render_run_report",
    "write_chrome_trace",
    "write_explore_report",
    "write_matrix_report",
    "write_run_report",
]
