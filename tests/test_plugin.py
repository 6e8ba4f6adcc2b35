"""The pytest plugin, exercised the way a vLLM developer's suite would use it (pytester)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: pytester drops modules an inner run imports)
import pytest

import racesim.scenarios.strategies  # noqa: F401  (likewise)
from racesim.documents import read_counterexample
from racesim.runner import run_scenario

with contextlib.suppress(ImportError):  # the plugin writes JSON when reports is missing
    from racesim import reports  # noqa: F401  (likewise)

pytest_plugins = ["pytester"]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # The plugin is not named here: the pytest11 entry point of the installed racesim loads it.
    return pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)


def test_help_lists_the_racesim_options(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--help")
    result.stdout.fnmatch_lines(["racesim: simulated vLLM request-lifecycle races:",
                                 "*--racesim-seed=N*", "*--racesim-report=DIR*"])


def test_the_header_shows_the_seed(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    run(pytester).stdout.fnmatch_lines(["racesim: seed 0 (--racesim-seed to change)"])
    result = run(pytester, "--racesim-seed", "42", "--racesim-report", str(tmp_path / "r"))
    result.stdout.fnmatch_lines(["racesim: seed 42 *", f"racesim: reports * {tmp_path / 'r'}"])


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    run(pytester, "--markers").stdout.fnmatch_lines(["@pytest.mark.racesim_policies(*policies)*"])


def test_the_fixture_passes_and_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from pathlib import Path
        from racesim.scenarios import load_scenario, scenario_to_toml

        SKIP = ["metrics-exact"]

        def test_fixed_policy_closes_the_window(racesim):
            result = racesim.check("abort-reuse", "abort-scope", witness=True, skip=SKIP,
                                   vllm="0.8")
            assert result.violations == () and racesim.runs == (result,)

        def test_buggy_is_caught(racesim):
            racesim.check("abort-reuse", "buggy", witness=True, skip=SKIP, vllm="0.8")

        def test_run_does_not_fail_and_takes_every_kind_of_input(racesim):
            by_name = racesim.run("abort-reuse", "buggy", witness=True, vllm="0.8")
            scen = load_scenario("abort-reuse").with_vllm("0.8")
            Path("copy.toml").write_text(scenario_to_toml(scen), encoding="utf-8")
            by_path = racesim.run(Path("copy.toml"), "buggy", witness=True, vllm="0.8")
            by_object = racesim.run(scen, "buggy", delays=["frontend.abort:after_pop=0.05"])
            by_mapping = racesim.run(scen, "buggy", delays={"frontend.abort:after_pop#0": 0.05})
            by_tuple = racesim.run(scen, "buggy", delays=[("frontend.abort:after_pop", 0, 0.05)])
            assert "unique-live-id" in by_name.violated
            assert by_name.trace_hash == by_path.trace_hash == by_object.trace_hash \\
                == by_mapping.trace_hash == by_tuple.trace_hash
    """)
    result = run(pytester, "-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*racesim: 'abort-reuse' under buggy (seed 0) violated * invariant(s): *unique-live-id*",
        "*unique-live-id at t=*",
        "*replay: racesim run abort-reuse -p buggy --vllm 0.8 --seed 0 --delay "
        "'frontend.abort:after_pop#0=0.05'*"])
    assert "Traceback" not in result.stdout.str()


def test_the_marker_parametrizes_over_policies(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.racesim_policies("buggy", "internal-id")
        def test_two(racesim, racesim_policy):
            racesim.check("abort-reuse", racesim_policy, witness=True, skip=["metrics-exact"])

        @pytest.mark.racesim_policies()
        def test_every_builtin(racesim_policy):
            assert racesim_policy

        def test_without_marker(racesim_policy):
            pass
    """)
    result = run(pytester, "-v")
    result.stdout.fnmatch_lines(["*test_two?buggy? FAILED*", "*test_two?internal-id? PASSED*"])
    for name in ("shipped", "buggy", "abort-scope", "engine-final", "internal-id"):
        result.stdout.fnmatch_lines([f"*test_every_builtin?{name}? PASSED*"])
    result.stdout.fnmatch_lines(["*'racesim_policy' is given by @pytest.mark.racesim_policies*"])
    result.assert_outcomes(passed=6, failed=1, errors=1)


def test_the_marker_rejects_an_unknown_policy(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.racesim_policies("nosuch")
        def test_x(racesim_policy):
            pass
    """)
    result = run(pytester)
    result.stdout.fnmatch_lines(["*racesim_policies on *test_x: unknown policy 'nosuch'*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error


def test_the_report_dir_gets_files_on_failure_only(pytester: pytest.Pytester,
                                                   tmp_path: Path) -> None:
    pytester.makepyfile("""
        def test_clean(racesim):
            racesim.check("abort-reuse", "internal-id", witness=True, skip=["metrics-exact"])

        def test_race(racesim):
            racesim.check("abort-reuse", "buggy", witness=True, seed=3)
    """)
    reports = tmp_path / "reports"
    result = run(pytester, "--racesim-report", str(reports))
    result.assert_outcomes(passed=1, failed=1)
    files = sorted(p.name for p in reports.iterdir())
    stems = {name.removesuffix(".html").removesuffix(".json").removesuffix(".run")
             for name in files}
    assert len(stems) == 1 and "test_race" in files[0] and "abort-reuse__buggy" in files[0]
    (stem,) = stems
    assert f"{stem}.json" in files
    assert f"{stem}.html" in files or f"{stem}.run.json" in files
    result.stdout.fnmatch_lines([f"*replay: racesim replay {reports / stem}.json*"])
    cx = read_counterexample(str(reports / f"{stem}.json"))
    assert (cx.policy, cx.seed) == ("buggy", 3)
    replay = run_scenario(cx.scenario, cx.policy, seed=cx.seed, schedule=cx.schedule)
    assert replay.trace_hash == cx.trace_hash
    if f"{stem}.run.json" in files:
        doc = json.loads((reports / f"{stem}.run.json").read_text(encoding="utf-8"))
        assert doc["trace_hash"] == cx.trace_hash
    else:
        html = (reports / f"{stem}.html").read_text(encoding="utf-8")
        assert "<html" in html.lower() and "racesim replay" in html


def test_a_passing_test_leaves_no_report_even_when_its_runs_violate(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Reports are for failing tests (README: "for every failing run" of a test that fails):
    an expected RaceFound, or a violating ``run``, in a test that passes writes nothing."""
    pytester.makepyfile("""
        import pytest

        def test_expects_the_race(racesim):
            with pytest.raises(AssertionError):
                racesim.check("abort-reuse", "buggy", witness=True)

        def test_looks_at_a_violating_run(racesim):
            assert racesim.run("abort-reuse", "buggy", witness=True).violations
            assert racesim.reports == ()

        def test_fails_after_an_expected_race(racesim):
            with pytest.raises(AssertionError):
                racesim.check("abort-reuse", "buggy", witness=True)
            assert False, "something else broke"
    """)
    reports = tmp_path / "reports"
    result = run(pytester, "--racesim-report", str(reports))
    result.assert_outcomes(passed=2, failed=1)
    files = sorted(p.name for p in reports.iterdir())
    assert files and all("test_fails_after_an_expected_race__" in name for name in files)


def test_a_generated_scenario_under_hypothesis(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The strategies and the fixture together: the report left behind is the shrunk example."""
    pytester.makepyfile("""
        from hypothesis import HealthCheck, given, settings
        from racesim.scenarios.strategies import scenarios

        HELD = ("frontend.abort:after_pop", None, 0.05)  # the BUG point, every occurrence

        # Any abort fails under buggy (at least metrics-exact), so every seed finds a failure.
        @settings(max_examples=100, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(scenarios(topology="single", frontends=1, async_scheduling=False, id_pool=["X"],
                         min_requests=2, max_requests=3, max_start=0.1, allow_eos=False,
                         allow_disconnects=False, allow_stop_strings=False, allow_n=False))
        def test_buggy_on_generated_workloads(racesim, scen):
            racesim.check(scen, "buggy", delays=[HELD])
    """)
    reports = tmp_path / "reports"
    result = run(pytester, "--racesim-report", str(reports))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*racesim: 'generated' under buggy*",
                                 f"*replay: racesim replay {reports}*.json*"])
    jsons = [p for p in reports.iterdir() if p.name.endswith(".json")
             and not p.name.endswith(".run.json")]
    assert len(jsons) == 1  # every failing example overwrote the same files
    cx = read_counterexample(str(jsons[0]))
    assert run_scenario(cx.scenario, "buggy", schedule=cx.schedule,
                        skip=cx.skip).trace_hash == cx.trace_hash


def test_bad_input_through_the_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from racesim.sim import InputError

        @pytest.mark.parametrize("kwargs", [
            {"policy": "nosuch"}, {"skip": ["nosuch"]}, {"delays": ["nosuch.point=1"]},
            {"delays": [("frontend.abort:after_pop", -1, 1.0)]},
            {"delays": {"frontend.abort:after_pop": -1}}, {"options": {"suffix_hex": 3}},
        ])
        def test_bad(racesim, kwargs):
            with pytest.raises(InputError):
                racesim.run("abort-reuse", **kwargs)

        def test_bad_scenario(racesim):
            with pytest.raises(InputError):
                racesim.run("nosuch-scenario")
            with pytest.raises(TypeError):
                racesim.run(42)
    """)
    run(pytester).assert_outcomes(passed=7)


def test_the_fixture_takes_the_id_scheme_apart_from_the_policy(pytester: pytest.Pytester,
                                                              tmp_path: Path) -> None:
    """``ids=`` is ``--ids``: "0.33 as shipped, IDs as given" is shipped with ids="given" (the
    same runs as buggy), and a failure's replay command and counterexample keep it."""
    pytester.makepyfile("""
        import pytest
        from racesim.sim import InputError

        def test_shipped_with_ids_as_given_is_buggy(racesim):
            given = racesim.run("duplicate-in-flight", "shipped", ids="given")
            assert given.violated == racesim.run("duplicate-in-flight", "buggy").violated
            assert "engine-alive" in given.violated
            assert "engine-alive" not in racesim.run("duplicate-in-flight", "shipped").violated

        def test_a_policy_with_its_own_ids_refuses_one(racesim):
            with pytest.raises(InputError):
                racesim.run("abort-reuse", "internal-id", ids="given")

        def test_fails_with_ids(racesim):
            racesim.check("duplicate-in-flight", "shipped", ids="given")
    """)
    result = run(pytester, "--racesim-report", str(tmp_path / "r"))
    result.assert_outcomes(passed=2, failed=1)
    files = sorted((tmp_path / "r").glob("*.json"))
    assert files and read_counterexample(str(files[0])).ids == "given"
