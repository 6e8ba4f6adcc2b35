"""racesim's pytest plugin: run simulated request lifecycles from your own tests.

Installed with racesim (``pytest11`` entry point ``racesim``), so any test can ask for it::

    def test_my_policy_closes_15326(racesim):
        racesim.check("abort-reuse", "my_pkg.lifecycle:MyPolicy", witness=True,
                      skip=["metrics-exact"])

    @pytest.mark.racesim_policies("abort-scope", "internal-id")
    def test_fixes(racesim, racesim_policy):
        racesim.check("abort-reuse", racesim_policy, witness=True, skip=["metrics-exact"])

It adds, in a ``racesim`` option group:

- ``--racesim-seed N``: the seed of every run the fixture makes without ``seed=`` (default 0,
  so runs are the same on every machine); shown in the pytest header.
- ``--racesim-report DIR``: when a test fails, for every violating simulated run it made
  through the fixture, write ``DIR/<test>__<scenario>__<policy>-<hash>.json`` (a
  counterexample that ``racesim replay`` reproduces anywhere) and the HTML run report beside
  it (``.html``; when the reports package cannot render one, the run's JSON document,
  ``.run.json``). Of several failing runs of the same test, scenario and policy the last
  one's files stay: under hypothesis that is the shrunk example, which hypothesis runs last.
  A test that passes writes nothing, even when it expected a ``RaceFound``
  (``pytest.raises``) or looked at a violating ``run``.

and the ``racesim`` fixture (:class:`RaceSim`), the ``racesim_policies`` marker and its
``racesim_policy`` argument. Using the fixture inside ``@given`` needs
``suppress_health_check=[HealthCheck.function_scoped_fixture]``: the fixture keeps no state
between examples that matters to them.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

import pytest

from racesim.plugin.arguments import DelaySpec
from racesim.plugin.arguments import load as _load
from racesim.plugin.arguments import options as _options
from racesim.plugin.arguments import plan as _plan

if TYPE_CHECKING:
    from racesim.documents import Counterexample
    from racesim.engine_model import RunResult
    from racesim.runner import RunSpec
    from racesim.scenarios import Scenario

__all__ = ["RaceSim", "RaceFound", "RaceSimReportWarning", "racesim", "racesim_policy",
           "pytest_addoption", "pytest_configure", "pytest_generate_tests", "pytest_report_header"]

MARKER: Final = "racesim_policies"
POLICY_ARG: Final = "racesim_policy"
_SEED = pytest.StashKey[int]()
_REPORT_DIR = pytest.StashKey["Path | None"]()
#: the test's fixture object, for writing its reports once the test is known to have failed
_FIXTURE = pytest.StashKey["RaceSim"]()
_MAX_LISTED = 10



class RaceFound(AssertionError):
    """Raised by :meth:`RaceSim.check` when a run violated an (unskipped) invariant.

    An ``AssertionError``, so ``pytest.raises(AssertionError)`` catches it and hypothesis,
    inside ``@given``, shrinks and prints its falsifying example. ``result`` is the run,
    ``counterexample`` the :class:`racesim.documents.Counterexample` that replays it anywhere
    (``racesim replay`` reads ``counterexample.as_dict()`` written as JSON)."""

    def __init__(self, message: str, result: RunResult, counterexample: Any) -> None:
        super().__init__(message)
        self.result = result
        self.counterexample = counterexample


class RaceSimReportWarning(UserWarning):
    """The HTML report of a failing run could not be written (its JSON was written instead)."""


# -- hooks ---------------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racesim", "racesim: simulated vLLM request-lifecycle races")
    group.addoption("--racesim-seed", action="store", type=int, default=None, metavar="N",
                    help="Seed of every run the racesim fixture makes without seed= "
                         "(default: 0).")
    group.addoption("--racesim-report", action="store", default=None, metavar="DIR",
                    help="Write an HTML run report and a replayable counterexample file to DIR "
                         "for every failing simulated run made through the racesim fixture.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*policies): run the test once per racesim lifecycle policy (a built-in name "
        f"or package.module:ClassName), given as the '{POLICY_ARG}' argument; with no "
        f"arguments, every built-in policy.")
    seed = config.getoption("racesim_seed", None)
    config.stash[_SEED] = 0 if seed is None else int(seed)
    report = config.getoption("racesim_report", None)
    config.stash[_REPORT_DIR] = Path(report) if report else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"racesim: seed {config.stash.get(_SEED, 0)} (--racesim-seed to change)"]
    report = config.stash.get(_REPORT_DIR, None)
    if report is not None:
        lines.append(f"racesim: reports of failing runs go to {report}")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    from racesim.engine_model import POLICIES
    from racesim.engine_model.policies import policy_spec
    from racesim.sim import InputError

    where = f"@pytest.mark.{MARKER} on {metafunc.definition.nodeid}"
    if marker.kwargs:
        pytest.fail(f"{where}: takes policy names only, not {sorted(marker.kwargs)}",
                    pytrace=False)
    policies = tuple(marker.args) or tuple(POLICIES)
    for p in policies:
        if not isinstance(p, str):
            pytest.fail(f"{where}: policies are strings, got {p!r}", pytrace=False)
        try:
            policy_spec(p)
        except InputError as exc:
            pytest.fail(f"{where}: {exc}", pytrace=False)
    if POLICY_ARG not in metafunc.fixturenames:
        pytest.fail(f"{where}: the test needs a '{POLICY_ARG}' argument", pytrace=False)
    metafunc.parametrize(POLICY_ARG, policies, ids=list(policies))


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def racesim(request: pytest.FixtureRequest) -> RaceSim:
    """Run racesim scenarios from a test: ``racesim.run(...)`` and ``racesim.check(...)``."""
    config = request.config
    sim = RaceSim(seed=config.stash.get(_SEED, 0), report_dir=config.stash.get(_REPORT_DIR, None),
                  test=request.node.nodeid)
    request.node.stash[_FIXTURE] = sim
    return sim


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's violating runs get their ``--racesim-report`` files (only then: a run
    that violates in a test that passes, e.g. under ``pytest.raises``, is what it expected)."""
    outcome = yield
    report = outcome.get_result()
    sim = item.stash.get(_FIXTURE, None)
    if sim is not None and report.when == "call" and report.failed:
        sim._write_pending()


@pytest.fixture
def racesim_policy() -> str:
    """Set by ``@pytest.mark.racesim_policies(...)``; asking for it without the marker fails."""
    pytest.fail(f"'{POLICY_ARG}' is given by @pytest.mark.{MARKER}(...); this test has no such "
                f"marker", pytrace=False)


# -- the fixture object --------------------------------------------------------------------------

@final
class RaceSim:
    """Runs scenarios under policies for one test, and explains the ones that fail.

    Every run is deterministic: the same scenario, policy, options, seed and delays give the
    same trace (hash) anywhere. ``seed`` defaults to the session's ``--racesim-seed``.
    """

    __slots__ = ("_seed", "_report_dir", "_test", "_runs", "_reports", "_pending")

    def __init__(self, *, seed: int, report_dir: Path | None, test: str) -> None:
        self._seed = seed
        self._report_dir = report_dir
        self._test = test
        self._runs: list[RunResult] = []
        self._reports: list[Path] = []
        #: each report stem's latest violating run, written if the test fails
        self._pending: dict[str, tuple[RunSpec, str | None, RunResult]] = {}

    @property
    def seed(self) -> int:
        """The seed of runs made without ``seed=``."""
        return self._seed

    @property
    def runs(self) -> tuple[RunResult, ...]:
        """Every run made through this fixture so far, oldest first."""
        return tuple(self._runs)

    @property
    def reports(self) -> tuple[Path, ...]:
        """The files written to ``--racesim-report`` (once the test failed)."""
        return tuple(self._reports)

    def run(self, scenario: str | os.PathLike[str] | Scenario, policy: str = "internal-id", *,
            options: Mapping[str, str] | None = None, witness: bool = False,
            delays: Iterable[DelaySpec] | Mapping[str, float] = (), skip: Iterable[str] = (),
            seed: int | None = None, vllm: str | None = None,
            engine: str = "model", ids: str | None = None) -> RunResult:
        """Run ``scenario`` (a bundled name, a path or a :class:`racesim.scenarios.Scenario`) under
        ``policy`` once and return its result; violations do not fail the test (see
        :meth:`check`). ``witness`` applies the scenario's ``[witness]`` schedule, ``delays``
        exact delays on top, ``skip`` leaves invariants unchecked, ``vllm`` picks the vLLM
        profile (default: the scenario's, else the newest), ``engine`` the backend ("model" or
        "vllm", the installed release), ``ids`` the request-ID scheme ("given" or "release",
        as ``--ids``; default: the policy's). Bad input raises ``racesim.sim.InputError``."""
        return self._run(*self._spec(scenario, policy, options, skip, seed, vllm, engine, ids),
                         witness, delays)[0]

    def check(self, scenario: str | os.PathLike[str] | Scenario, policy: str = "internal-id",
              *, options: Mapping[str, str] | None = None, witness: bool = False,
              delays: Iterable[DelaySpec] | Mapping[str, float] = (), skip: Iterable[str] = (),
              seed: int | None = None, vllm: str | None = None,
              engine: str = "model", ids: str | None = None) -> RunResult:
        """:meth:`run`, then fail the test if any (unskipped) invariant was violated: raise
        :class:`RaceFound` (an ``AssertionError``) with the violations, the one command that
        replays the run, and the counterexample."""
        __tracebackhide__ = True
        spec, replay_name = self._spec(scenario, policy, options, skip, seed, vllm, engine, ids)
        result, failed = self._run(spec, replay_name, witness, delays)
        if failed:
            raise RaceFound(failed, result, self._counterexample(spec, result))
        return result

    def _spec(self, scenario: object, policy: str, options: Mapping[str, str] | None,
              skip: Iterable[str], seed: int | None,
              vllm: str | None, engine: str = "model",
              ids: str | None = None) -> tuple[RunSpec, str | None]:
        """What to run (options and skipped invariants in the caller's order, as the replay
        command and the counterexample write them), and the name ``racesim run`` finds the
        scenario by (None: no file)."""
        from racesim.runner import RunSpec, as_backend

        scen, replay_name = _load(scenario)
        skipped = (skip,) if isinstance(skip, str) else tuple(skip)
        spec = RunSpec(scen.with_vllm(vllm), policy, tuple(_options(options).items()),
                       self._seed if seed is None else seed, skipped, as_backend(engine), ids)
        spec.id_scheme  # a bad ids, or ids for a policy with its own, is InputError now
        return spec, replay_name

    def explore(self, scenario: str | os.PathLike[str] | Scenario,
                policy: str = "internal-id", **kwargs: Any) -> list[Any]:
        """Search ``scenario``'s schedules (``budget=100``, ``reach="all"`` or ``"live"``,
        ``engine="model"`` or ``"vllm"``, ``vllm_src=``/``vllm_patch=``/``vllm_base=``,
        ``strategy``, ``options``, ``skip``, ``vllm``, ``seed``, ``ids``): the races found, each
        with the command that replays it; ``[]`` when clean (racesim/plugin/search.py)."""
        from racesim.plugin.search import explore

        seed = kwargs.pop("seed", None)
        return explore(scenario, policy, self._out_dir(), self._seed if seed is None else seed,
                       **kwargs)

    def diff(self, scenario: str | os.PathLike[str] | Scenario, policy: str = "internal-id",
             **kwargs: Any) -> list[Any]:
        """What a vLLM change (``vllm_src=`` or ``vllm_patch=``) opens against the installed
        release (or ``base_src=``/``base_patch=``), as ``racesim diff`` decides it: one finding
        per opened invariant; ``[]`` when it opens nothing."""
        from racesim.plugin.search import diff

        seed = kwargs.pop("seed", None)
        return diff(scenario, policy, self._out_dir(), self._seed if seed is None else seed,
                    **kwargs)

    def _out_dir(self) -> Path:
        """Where searches write counterexample files: ``--racesim-report``, else
        ``racesim-out`` in the current folder (absolute, so a replay command works anywhere)."""
        return (self._report_dir or Path("racesim-out")).resolve()

    def _run(self, spec: RunSpec, replay_name: str | None, witness: bool,
             delays: Iterable[DelaySpec] | Mapping[str, float]) -> tuple[RunResult, str]:
        """The run, and the explanation of its failure ("" when nothing was violated)."""
        result = spec.run(witness=witness, delays=_plan(delays))
        self._runs.append(result)
        if not result.violations:
            return result, ""
        if self._report_dir is not None:
            self._pending[self._stem(spec)] = (spec, replay_name, result)
        return result, self._explain(spec, replay_name, result)

    # -- failures -----------------------------------------------------------------------------

    def _stem(self, spec: RunSpec) -> str:
        from racesim.documents import safe_file_name

        name, policy = spec.scenario.name, spec.policy
        key = f"{self._test}\x1f{name}\x1f{policy}"
        readable = safe_file_name(f"{self._test}__{name}__{policy}")
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"{readable[-120:].lstrip('_.')}-{digest}"

    def _counterexample(self, spec: RunSpec, result: RunResult) -> Counterexample:
        from racesim.documents import Counterexample

        from racesim.documents import violation_dicts

        return Counterexample(spec.scenario, spec.policy, spec.option_dict, result.seed,
                              result.schedule, spec.skip, tuple(violation_dicts(result)),
                              result.trace_hash, None, {"pytest": self._test},
                              engine=spec.engine, ids=spec.id_scheme,
                              frontend=result.frontend if spec.backend.is_vllm else "",
                              runner=result.runner)

    def _command(self, spec: RunSpec, replay_name: str | None, result: RunResult) -> str | None:
        from racesim.runner import replay_command, run_command

        if self._report_dir is not None:  # absolute: it works from any folder as printed
            return replay_command(os.path.abspath(self._report_dir / f"{self._stem(spec)}.json"),
                                  spec.policy, spec.engine)
        if replay_name is not None:
            return run_command(replay_name, spec.policy, spec.option_dict, result.seed,
                               result.schedule, spec.skip, vllm=result.vllm, engine=spec.engine,
                               ids=spec.ids, frontend=spec.backend.frontend,
                               runner=spec.backend.runner)
        return None

    def _explain(self, spec: RunSpec, replay_name: str | None, result: RunResult) -> str:
        from racesim.reports.model import reader_numbers, relabel_incs

        numbers = reader_numbers(result.trace)  # incarnations 1, 2, 3 as the reports show them
        n = len(result.violations)
        lines = [f"racesim: {spec.scenario.name!r} under {spec.policy} (seed {result.seed}) "
                 f"violated {len(result.violated)} invariant(s): {', '.join(result.violated)}"]
        for v in result.violations[:_MAX_LISTED]:
            lines.append(f"  {v.invariant} at t={v.time:.4f}"
                         + (f" [{v.request}]" if v.request is not None else "")
                         + f": {relabel_incs(v.detail, numbers)}")
        if n > _MAX_LISTED:
            lines.append(f"  ... and {n - _MAX_LISTED} more")
        from racesim.plugin.failure import failure_lines

        command = self._command(spec, replay_name, result)
        stem = (os.path.abspath(self._report_dir / self._stem(spec))
                if self._report_dir is not None else None)
        if command:
            lines += failure_lines(spec, result, command, stem)
        else:  # a scenario with no file (drawn by hypothesis, built in code): its TOML
            from racesim.documents import safe_file_name
            from racesim.runner import run_command
            from racesim.scenarios import scenario_to_toml

            path = f"{safe_file_name(spec.scenario.name)}.toml"
            lines += failure_lines(
                spec, result, f"save the scenario TOML below as {path}, then: "
                + run_command(path, spec.policy, spec.option_dict, result.seed,
                              result.schedule, spec.skip, vllm=result.vllm), None)
            lines.append("scenario TOML:\n" + scenario_to_toml(spec.scenario).rstrip())
        return "\n".join(lines)

    def _write_pending(self) -> None:
        pending, self._pending = list(self._pending.values()), {}
        for spec, replay_name, result in pending:
            try:
                self._write_report(spec, replay_name, result)
            except OSError as exc:  # a report must never hide the test's verdict
                warnings.warn(RaceSimReportWarning(
                    f"racesim: no report for {self._test} ({exc})"), stacklevel=2)

    def _write_report(self, spec: RunSpec, replay_name: str | None, result: RunResult) -> None:
        from racesim.documents import run_document, write_counterexample

        assert self._report_dir is not None
        stem = self._report_dir / self._stem(spec)
        written = [write_counterexample(stem.with_name(stem.name + ".json"),
                                        self._counterexample(spec, result))]
        command = self._command(spec, replay_name, result) or ""
        html = stem.with_name(stem.name + ".html")
        try:
            from racesim.reports import write_run_report

            written.append(write_run_report(html, spec.scenario, spec.policy, spec.option_dict,
                                            result, command))
        except Exception as exc:  # a report must never hide the test's verdict
            import json

            doc = stem.with_name(stem.name + ".run.json")
            doc.write_text(json.dumps(run_document(spec, result), indent=2,
                                      ensure_ascii=False) + "\n", encoding="utf-8")
            written.append(doc)
            warnings.warn(RaceSimReportWarning(
                f"racesim: no HTML report for {self._test} ({type(exc).__name__}: {exc}); "
                f"wrote {doc} instead"), stacklevel=3)
        self._reports.extend(p for p in written if p not in self._reports)
