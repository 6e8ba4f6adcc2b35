"""The real frontend's await points, read from the installed release's code.

Every ``await`` inside a coroutine of ``vllm/v1/engine/async_llm.py`` and
``vllm/v1/engine/core_client.py`` is listed with the vLLM function it is in, its await expression
and its line (shown, never keyed on: lines move between releases). Its kind decides its width:

- ``yield``: ``await asyncio.sleep(0)``, a bare yield to the loop; it may resume late when other
  ready work holds the loop. Run-time name ``yield:<module>.<function>:sleep(0)``.
- ``latent``: an await whose future pyzmq completes eagerly, the socket sends (``add_request_async``,
  ``abort_requests_async``, ``_send_input``...): vLLM never suspends there; a delay is what an
  inserted ``await`` would do. Run-time name ``send:<the vLLM caller>:<ADD|ABORT|UTILITY>``.
- ``live``: a real suspension (a queue, a collector, a utility reply, a receive, an executor);
  what resumes it is a delivery (``ipc.output:transit``) or an executor completion
  (``exec:<function>``), which are the delayed points.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["catalogue"]

_FILES = ("v1/engine/async_llm.py", "v1/engine/core_client.py")
_SENDS = ("add_request_async", "abort_requests_async", "_send_input", "_send_input_message",
          "call_utility_async", "_call_utility_async", "send_multipart")


def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _kind(expr: str, coroutines: set[str]) -> str:
    if expr.startswith("asyncio.sleep(0)"):
        return "yield"
    if expr.startswith("asyncio."):
        return "live"  # a timer, gather, to_thread: asyncio's own suspension
    called = expr.split("(", 1)[0].rsplit(".", 1)[-1]
    if called in _SENDS:
        return "latent"
    if called in coroutines:
        return "call"  # vLLM's own coroutine: it suspends only where the callee does
    return "live"


_MEANING = {"yield": "bare yield to the loop",
            "latent": "eager pyzmq send (never suspends)",
            "call": "a call of vLLM's own coroutine (suspends where it does)",
            "live": "real suspension, resumed by a delivery or an executor completion"}


class _Scan(ast.NodeVisitor):
    def __init__(self, module: str, source: str, coroutines: set[str]) -> None:
        self.coroutines = coroutines
        self.module = module
        self.source = source
        self.stack: list[tuple[str, bool]] = []
        self.rows: list[dict[str, Any]] = []

    def _scope(self, node: Any, is_async: bool) -> None:
        self.stack.append((node.name, is_async))
        self.generic_visit(node)
        self.stack.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scope(node, False)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scope(node, False)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scope(node, True)

    def visit_Await(self, node: ast.Await) -> None:
        expr = ast.get_source_segment(self.source, node.value) or ""
        expr = " ".join(expr.split())
        short = expr.split("(", 1)[0] + ("(...)" if "(" in expr else "")
        if expr.startswith("asyncio.sleep(0)"):
            short = "asyncio.sleep(0)"
        func = ".".join(name for name, _a in self.stack)
        kind = _kind(expr, self.coroutines)
        self.rows.append({"name": f"{self.module}.{func}: await {short}", "width": kind,
                          "line": node.lineno,
                          "meaning": _MEANING[kind]})
        self.generic_visit(node)


def catalogue() -> tuple[str, list[dict[str, Any]]]:
    """(the vLLM version scanned, one row per await) of the installed release."""
    root = _vllm_root()
    if root is None:
        return "", []
    from importlib import metadata

    version = metadata.version("vllm")
    rows: list[dict[str, Any]] = []
    trees = {rel: ((root / rel).read_text()) for rel in _FILES if (root / rel).exists()}
    parsed = {rel: ast.parse(src) for rel, src in trees.items()}
    coroutines = {n.name for tree in parsed.values() for n in ast.walk(tree)
                  if isinstance(n, ast.AsyncFunctionDef)}
    for rel, source in trees.items():
        scan = _Scan(rel[:-3].replace("/", "."), source, coroutines)
        scan.visit(parsed[rel])
        rows.extend(scan.rows)
    rows.extend([
        {"name": "ipc.input:transit", "width": "live", "line": 0,
         "meaning": "one API server -> engine pipe (FIFO): ADD/ABORT/UTILITY frames"},
        {"name": "ipc.output:transit", "width": "live", "line": 0,
         "meaning": "engine -> API server pipe (FIFO): EngineCoreOutputs frames"},
        {"name": "exec:<function>", "width": "live", "line": 0,
         "meaning": "run_in_executor / asyncio.to_thread completion (inline, no thread)"},
    ])
    return version, rows
