"""The ``racesim`` command line: the group, and one module per command group, each of which
only parses, calls the library and renders (run.py: run, replay; listing.py: list, show;
explore.py; matrix.py; conform.py; corpus.py; bench.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from racesim.cli.bench import bench_cmd
from racesim.cli.conform import conform_cmd
from racesim.cli.corpus import corpus_cmd
from racesim.cli.diff import diff_cmd
from racesim.cli.explore import explore_cmd
from racesim.cli.listing import list_cmd, show_cmd
from racesim.cli.matrix import matrix_cmd
from racesim.cli.repro import repro_cmd
from racesim.cli.run import replay_cmd, run_cmd
from racesim.cli.support import PipeAwareGroup, PipeClosed, quiet_stdout
from racesim.cli.support import fail as _fail
from racesim.sim import InputError, build_info

__all__ = ["main", "cli"]


@click.group(cls=PipeAwareGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racesim",
                      message=f"%(prog)s %(version)s, {build_info()}")
def cli() -> None:
    """Deterministic race-condition simulator for vLLM V1 request lifecycles.

    Replays, explores and shrinks request-ID races (vLLM #15326, #29355, #20139, #27711)
    against lifecycle policies on a vLLM release profile (--vllm, default 0.33), checks
    invariants, labels each race live (reachable in vLLM as released) or latent (needs a delay
    where that release never yields), and writes HTML race reports.

    \b
    Exit status: 0 no race (an accounting-only violation such as metrics-exact is a warning;
    --strict counts it), 1 a race (a safety or liveness invariant broke), 2 bad input or a
    user policy that raised, 130 interrupted (after writing what was found). matrix exits 0
    when it completed, 1 only with --fail-on-race and a racing cell.
    """


# click lists a group's commands sorted by name, whatever the order they are added in
for _command in (list_cmd, show_cmd, run_cmd, replay_cmd, explore_cmd, bench_cmd, matrix_cmd,
                 conform_cmd, corpus_cmd, diff_cmd, repro_cmd):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: bad input is one line on stderr and exit status 2."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="racesim",
                 standalone_mode=False)
    except InputError as exc:
        _fail(str(exc))
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except click.UsageError as exc:
        _fail(exc.format_message())
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("racesim: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        _fail(exc.format_message())
    except PipeClosed:  # the reader of stdout has gone (| head): what it wanted, it has
        quiet_stdout()
        sys.exit(0)
    except OSError as exc:  # an output file that cannot be written after all (disk full, ...)
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    sys.exit(0)


