"""The bug corpus: the ``[corpus]`` table of a scenario file, and ``racesim corpus``.

A corpus entry is a scenario with a ``[corpus]`` table (issue, fix PR, releases, the invariant
that shows the bug) and no hint: no ``[witness]``, no ``[delays]`` (README "The bug corpus").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_run import assert_one_line_error, racesim

from racesim.corpus import profile_of_release, release_python
from racesim.scenarios import (
    corpus_names,
    load_scenario,
    parse_scenario,
    scenario_from_dict,
    scenario_to_toml,
)
from racesim.sim import InputError

_ENTRY = """
name = "1-example"
[engine]
async_scheduling = true
[[request]]
id = "X"
at = 0.0
prompt_tokens = 16
max_tokens = 4
[corpus]
issue = 1
fix_pr = 2
title = "an example bug"
buggy_release = "{buggy}"
fixed_release = "{fixed}"
invariant = "engine-alive"
description = '''
What the threads say.
'''
"""


def entry(buggy: str = "0.9.2", fixed: str = "0.10.1.1", extra: str = "") -> str:
    return _ENTRY.format(buggy=buggy, fixed=fixed) + extra


def test_a_corpus_table_loads_and_round_trips() -> None:
    scen = parse_scenario(entry(), "e.toml")
    info = scen.corpus
    assert info is not None
    assert (info.issue, info.fix_pr, info.buggy_release, info.fixed_release, info.invariant) \
        == (1, 2, "0.9.2", "0.10.1.1", "engine-alive")
    assert info.description.strip() == "What the threads say."
    assert info.policy == "" and info.symptom == ""
    assert parse_scenario(scenario_to_toml(scen), "again.toml") == scen
    assert scenario_from_dict(scen.to_dict()) == scen
    assert parse_scenario(_ENTRY.split("[corpus]")[0], "plain.toml").corpus is None


@pytest.mark.parametrize(("extra", "needle"), [
    ('colour = "red"\n', "corpus.colour: unknown key"),
    ('policy = "nope"\n', "corpus.policy: must be a built-in policy"),
    ('symptom = 3\n', "corpus.symptom: must be a string"),
])
def test_corpus_keys_are_checked(extra: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle.replace(".", r"\.")):
        parse_scenario(entry(extra=extra), "e.toml")


@pytest.mark.parametrize(("text", "needle"), [
    (entry(buggy="0.20"), ""),  # two parts are a release too
    (entry(buggy="latest"), 'corpus.buggy_release: must be a vLLM release such as "0.20.0"'),
    (entry().replace('invariant = "engine-alive"', 'invariant = "alive"'),
     "corpus.invariant: must be one of"),
    (entry().replace("issue = 1", "issue = 0"), "corpus.issue: must be a vLLM issue"),
    (entry().replace('title = "an example bug"', 'title = " "'), "corpus.title: must not be"),
    (entry().replace("fix_pr = 2\n", ""), "corpus.fix_pr: required key is missing"),
    (entry() + '[witness]\n"ipc.input:transit" = 0.01\n', "corpus: a corpus entry has no"),
    (entry() + '[delays]\n"ipc.input:transit" = 0.01\n', "corpus: a corpus entry has no"),
])
def test_a_bad_corpus_table_is_one_error(text: str, needle: str) -> None:
    if not needle:
        assert parse_scenario(text, "e.toml").corpus is not None
        return
    with pytest.raises(InputError) as err:
        parse_scenario(text, "e.toml")
    assert needle in str(err.value) and "e.toml" in str(err.value)


def test_an_open_bug_has_no_fixed_release_to_explore(tmp_path: Path) -> None:
    """fix_kind = "open": the fixed release is "open", the fix PR a proposed one; racesim
    corpus explores the buggy release only and says "open" where a fixed release would be."""
    from racesim.cli.corpus import markdown_table
    from racesim.corpus import CorpusOptions, entry_releases, run_corpus

    text = entry(buggy="0.33.0", fixed="open", extra='fix_kind = "open"\n')
    info = parse_scenario(text, "e.toml").corpus
    assert info is not None and info.fix_text == "open; proposed fix #2 not merged"
    with pytest.raises(InputError, match='corpus.fixed_release: must be a vLLM release'):
        parse_scenario(entry(fixed="open"), "e.toml")
    with pytest.raises(InputError, match='corpus.fixed_release: must be "open"'):
        parse_scenario(entry(extra='fix_kind = "open"\n'), "e.toml")
    path = tmp_path / "1-example.toml"
    path.write_text(text, encoding="utf-8")
    scen = load_scenario(str(path))
    assert entry_releases([scen]) == ["0.33.0"]
    doc = run_corpus([scen], opts=CorpusOptions(budget=1, model_budget=1, shrink_runs=0),
                     only_release="0.33.0")
    (e,) = doc["entries"]
    assert e["fixed"] == {"release": "open", "status": "open"}
    assert doc["fixed_tried"] == 0
    assert markdown_table(doc).splitlines()[2].endswith("| open | open |")


def test_every_bundled_entry_is_a_corpus_entry_with_no_hint() -> None:
    names = corpus_names()
    assert names
    for name in names:
        scen = load_scenario(name)
        assert scen.corpus is not None, name
        assert not scen.witness and not scen.delays and not scen.has_witness, name
        assert name.startswith(f"{scen.corpus.issue}-"), name
        assert scen.name == name


def test_releases_map_to_profiles_and_venvs(tmp_path: Path) -> None:
    assert profile_of_release("0.33.0") == "0.33"
    assert profile_of_release("0.8.5") == "0.8"
    assert release_python(None, "0.20.0") is None
    assert release_python(tmp_path, "0.20.0") is None
    python = tmp_path / "0.20.0" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert release_python(tmp_path, "0.20.0") == python


def test_list_corpus_lists_every_entry() -> None:
    proc = racesim("list", "corpus", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["corpus"]
    assert [r["name"] for r in rows] == list(corpus_names())
    assert all({"issue", "fix_pr", "buggy_release", "fixed_release", "invariant"} <= set(r)
               for r in rows)


def test_corpus_skips_a_release_that_is_not_installed(tmp_path: Path) -> None:
    """Both releases missing (no venv folder): each side is skipped with the install line,
    and the JSON document has its shape."""
    path = tmp_path / "1-example.toml"
    path.write_text(entry(buggy="0.9.2", fixed="0.10.1.1"), encoding="utf-8")
    none = str(tmp_path / "no-venvs")  # whatever RACESIM_VLLM_VENVS names on this machine
    proc = racesim("corpus", str(path), "--json", "--out", str(tmp_path / "out"), "--venvs", none)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"installed", "releases", "options", "entries", "found", "tried", "fixed_clean",
            "fixed_tried", "skipped", "elapsed_s"} <= set(doc)
    assert doc["releases"] == ["0.9.2", "0.10.1.1"]
    (e,) = doc["entries"]
    assert (e["issue"], e["fix_pr"], e["invariant"]) == (1, 2, "engine-alive")
    for role, release in (("buggy", "0.9.2"), ("fixed", "0.10.1.1")):
        assert e[role]["release"] == release
        assert e[role]["status"] == "skipped"
        assert "racesim corpus --install DIR" in e[role]["reason"]
    assert (doc["found"], doc["tried"], doc["fixed_tried"]) == (0, 0, 0)
    assert len(doc["skipped"]) == 2
    human = racesim("corpus", str(path), "--out", str(tmp_path / "out"), "--venvs", none, "--html",
                    str(tmp_path / "corpus.html"))
    assert human.returncode == 0, human.stderr
    assert "skipped: vLLM 0.9.2 is not installed here" in human.stdout
    page = (tmp_path / "corpus.html").read_text(encoding="utf-8")
    assert "an example bug" in page and "What the threads say." in page
    assert "racesim corpus --install DIR" in page


@pytest.mark.parametrize(("args", "needles"), [
    (["no-such-entry"], ("unknown scenario 'no-such-entry'",)),
    (["abort-reuse"], ("abort-reuse: not a corpus entry",)),
    (["--release", "new"], ("--release 'new'", "0.20.0")),
    (["--budget", "0"], ("--budget",)),
])
def test_bad_input_is_exit_2(args: list[str], needles: tuple[str, ...]) -> None:
    assert_one_line_error(racesim("corpus", *args), *needles)


def test_another_release_runs_in_its_venv_and_is_merged(tmp_path: Path) -> None:
    """A release with a venv under --venvs runs there (``DIR/<version>/bin/python -m racesim
    corpus ... --release V --json``); its answer is merged, read past a log line that an old
    vLLM prints on stdout while it imports."""
    path = tmp_path / "1-example.toml"
    path.write_text(entry(buggy="0.9.2", fixed="0.10.1.1"), encoding="utf-8")
    venv = tmp_path / "venvs" / "0.9.2" / "bin"
    venv.mkdir(parents=True)
    answer = {"entries": [{"name": "1-example",
                           "buggy": {"release": "0.9.2", "status": "found", "runs": 4,
                                     "first_find_run": 3, "first_find_s": 0.5},
                           "fixed": {"release": "0.10.1.1", "status": "not run"}}]}
    args = tmp_path / "args.txt"
    (venv / "python").write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" > {args}\n"
        "echo 'ERROR 12-03 [config.py:29] Failed to import Triton kernels.'\n"
        f"cat <<'EOF'\n{json.dumps(answer, indent=2)}\nEOF\n", encoding="utf-8")
    (venv / "python").chmod(0o755)
    proc = racesim("corpus", str(path), "--json", "--venvs", str(tmp_path / "venvs"),
                   "--budget", "7", "--seed", "3", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (e,) = doc["entries"]
    assert e["buggy"]["status"] == "found" and e["buggy"]["first_find_run"] == 3
    assert e["fixed"]["status"] == "skipped"  # 0.10.1.1 has no venv there
    assert (doc["found"], doc["tried"]) == (1, 1)
    called = args.read_text(encoding="utf-8").split()
    assert called[:4] == ["-I", "-m", "racesim", "corpus"]  # isolated: no current folder
    assert "--release" in called and called[called.index("--release") + 1] == "0.9.2"
    assert called[called.index("--budget") + 1] == "7"
    assert called[called.index("--seed") + 1] == "3"


def test_a_guard_is_not_called_a_fix() -> None:
    """#42492's fix_pr #48245 brought the guard 0.33.0 has, but a later thread ties it to the
    preemption path: the entry says "guard present since #48245", never "fixed by"."""
    info = load_scenario("42492-cancel-resubmit-async").corpus
    assert info is not None and info.fix_kind == "guard"
    assert info.fix_text == "guard present since #48245"
    proc = racesim("list", "corpus", "--json")
    row = next(r for r in json.loads(proc.stdout)["corpus"]
               if r["name"] == "42492-cancel-resubmit-async")
    assert "guard present since #48245" in row["meaning"] and "fixed by" not in row["meaning"]
    with pytest.raises(InputError, match="fix_kind"):
        parse_scenario(entry(extra='fix_kind = "maybe"\n'), "1-example.toml")
