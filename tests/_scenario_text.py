"""A scenario text and helpers the loader's tests share (test_scenario_loader.py,
test_scenario_checks.py)."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from racesim.scenarios import Scenario, parse_scenario, scenario_from_dict
from racesim.sim.errors import InputError

__all__ = ["BASE", "HOSTILE_IDS", "base_dict", "error_of", "mutate", "scenario_of"]

BASE = '''\
name = "base"
summary = "s"
topology = "single"
frontends = 2
horizon = 10.0

[engine]
num_blocks = 64
block_size = 16
max_num_seqs = 16
max_num_batched_tokens = 2048
step_time = 0.01
async_scheduling = false

[ipc]
latency = 0.0005

[frontend]
output_chunk_size = 128

[pd]
transfer_time = 0.002
hold_timeout = 480.0
proxy_ids = "client"

[[request]]
id = "A"
at = 0.0
prompt_tokens = 32
max_tokens = 40

[[request]]
id = "B"
at = 0.5
prompt_tokens = 8
max_tokens = 8
abort_at = 1.0
eos_at = 4
stop_string_at = 3
disconnect_after_tokens = 2
n = 2
frontend = 1

[delays]
"ipc.input:transit" = 0.0

[witness]
"frontend.abort:after_pop#2" = 0.05
'''

HOSTILE_IDS = ['"><img src=x onerror=alert(2)>', 'a"b\\c', "héllo wörld ✓ 名前 🚀", "line\nbreak",
               "tab\there", "nul\x00del\x7fesc\x1b", "'single' \"double\"", "\\u0041 not an escape",
               "\u2028\u0085\ufeff", "# not a comment", "[[request]]", '"""', "'''", " "]


def mutate(old: str, new: str, nth: int = 0) -> tuple[str, int]:
    """BASE with the nth line equal to ``old`` replaced by ``new``; returns (text, its line)."""
    lines = BASE.split("\n")
    hits = [i for i, line in enumerate(lines) if line == old]
    lines[hits[nth]] = new
    return "\n".join(lines), hits[nth] + 1


def error_of(text: str, source: str = "x.toml") -> str:
    with pytest.raises(InputError) as info:
        parse_scenario(text, source)
    message = str(info.value)
    assert "\n" not in message
    return message


def base_dict() -> dict[str, Any]:
    return tomllib.loads(BASE)


def scenario_of(ids: list[str], **request: Any) -> Scenario:
    return scenario_from_dict({"name": "hostile", "summary": "ids: " + " ".join(ids),
                               "request": [{"id": i, **request} for i in ids]})
