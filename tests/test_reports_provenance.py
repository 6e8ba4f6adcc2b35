"""Issue 28 item 3: every violation says what decided it (vLLM's code or a simulated part),
every run which components were vLLM's code, and a fingerprint of the vLLM code that ran."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from _cli import cli
from racesim.reports import provenance as prov


def test_a_model_run_says_every_part_is_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "run", "dropped-add", "-p", "shipped", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["violations"]
    for v in doc["violations"]:
        assert v["provenance"]["by"] == "simulated" and v["provenance"]["text"]
    comp = doc["components"]
    assert comp["vllm_code"] == [] and comp["vllm_fingerprint"] is None
    assert "simulated sockets (ZMQ)" in comp["simulated"].values()
    assert "not a fingerprint of vLLM's code" in comp["trace_hash_meaning"]
    code, out, _err = cli(capsys, "run", "dropped-add", "-p", "shipped")
    assert "decided by (no-hang): racesim's model" in " ".join(out.split())
    assert "not a fingerprint of vLLM's code" in " ".join(out.split())


def test_on_the_vllm_backend_the_socket_is_named_and_an_exception_is_vllms() -> None:
    hang = prov.provenance({"invariant": "no-hang"}, "vllm", "0.33.0")
    assert hang["by"] == "mixed" and "sockets" in hang["simulated"]
    assert "simulated sockets (ZMQ)" in hang["text"] and "OutputProcessor" in hang["text"]
    raised = prov.provenance({"invariant": "engine-alive",
                              "vllm_where": "v1/core/sched/async_scheduler.py:53"}, "vllm",
                             "0.20.0")
    assert raised["by"] == "vllm-exception"
    assert raised["text"] == ("vLLM 0.20.0's own code raised it at "
                              "v1/core/sched/async_scheduler.py:53")
    kv = prov.provenance({"invariant": "kv-ownership"}, "vllm", "0.33.0")
    assert kv["by"] == "vllm-state" and "KVCacheManager" in kv["text"]
    assert set(prov.READS) == set(__import__("racesim.engine_model.invariants",
                                             fromlist=["INVARIANTS"]).INVARIANTS)


def test_the_html_report_shows_provenance_and_the_hash_meaning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "r.html"
    cli(capsys, "run", "abort-reuse", "-p", "buggy", "--witness", "--html", str(page))
    html = page.read_text()
    assert "decided by: racesim&#39;s model" in html
    assert "it is not a fingerprint of vLLM&#39;s code" in html


def test_the_fingerprint_covers_the_imported_vllm_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("X = 1\n")
    fake = types.ModuleType("vllm")
    fake.__file__ = str(pkg / "__init__.py")
    core = types.ModuleType("vllm.core")
    core.__file__ = str(pkg / "core.py")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.core", core)
    stock = prov.vllm_fingerprint.__wrapped__()
    (pkg / "core.py").write_text("X = 2  # patched\n")
    patched = prov.vllm_fingerprint.__wrapped__()
    assert stock and patched and stock != patched


def test_vllms_own_frontend_is_named_as_vllms_when_it_runs() -> None:
    """The run says whose frontend ran (RunResult.frontend); the environment is not read
    here (the backend read it once, engine_vllm/frontend/select.py)."""
    assert prov.components("vllm")["frontend"] == "model frontend (AsyncLLM)"
    assert prov.components("vllm", frontend="vllm")["frontend"] == "vllm"
    assert prov.components("model", frontend="vllm")["frontend"] == "model frontend (AsyncLLM)"
    doc = prov.components_doc("vllm", "", "model", "request 'X': the OpenAI serving layer")
    assert doc["model_frontend_because"] == "request 'X': the OpenAI serving layer"
    assert "frontend" in prov.components_doc("vllm", "", "vllm")["vllm_code"]
    assert "model_frontend_because" not in prov.components_doc("model")
