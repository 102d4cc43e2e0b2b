"""Entry point: ``python -m reproductions <command> ...``.

Commands:
    fit, validate, test, predict   Lightning's subcommands through ReproductionCLI (``--help`` on each)
    sweep                          run an ablation grid (reproductions/commands/sweep.py): variant x seed runs
    report                         a sweep's table beside the paper and its figures (reproductions/commands/report.py)
    claims                         every sweep's claims at every scale on one page, docs/claims.md (reproductions/commands/claims.py)
    registry                       the results registry in results/: add runs, list, check, tables (reproductions/commands/registry.py)
    analyze                        attention analyses of a checkpoint or timm ViT (reproductions/commands/analyze.py)
    data                           prepare image data ahead of time, show what is prepared (reproductions/commands/data.py)
    sync                           upload the offline W&B runs under a path with wandb sync (reproductions/commands/sync.py)
    bench                          benchmarks with ratios against peers run in the same process (reproductions/commands/bench.py):
                                   trainer, vit, hybrid, data, bst, gpu

``repro --help`` lists these commands before Lightning's own help.

Every command fails the same way (reproductions/run/errors.py): one last line ``error: ...`` naming
what is wrong and what to do, exit status 2 for a usage error and 1 for a failure while running,
no traceback unless ``--debug`` is on the command line (anywhere) or ``REPRO_DEBUG=1``.

SIGTERM, SIGINT and SIGUSR1 stop every command from the moment ``main`` starts
(``utils/stop.py``): one ``error: stopped by SIGTERM ...`` line, exit status 128 + the signal's
number; a fit that has started training stops at the end of the step and saves a checkpoint
(``reproductions/run/signals.py``), a sweep stops its runs that way (``reproductions/sweeping/launch.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module

from reproductions.run.errors import RunInterrupted, argparse_errors, pop_debug_flag, run_command
from utils import stop

#: commands beside Lightning's (fit, validate, test, predict): name -> module with ``main(argv)``
TOOLS = {
    "bench": "reproductions.commands.bench",
    "sweep": "reproductions.commands.sweep",
    "report": "reproductions.commands.report",
    "claims": "reproductions.commands.claims",
    "registry": "reproductions.commands.registry",
    "analyze": "reproductions.commands.analyze",
    "data": "reproductions.commands.data",
    "sync": "reproductions.commands.sync",
}
#: what each of TOOLS does, for ``repro --help``
SUMMARIES = {
    "sweep": "run an ablation grid: variant x seed runs, then its report",
    "report": "a sweep's table beside the paper, its claim checks and figures",
    "claims": "every sweep's claims at every scale on one page (docs/claims.md) with figures",
    "registry": "the results registry (results/): add finished runs, list, check, README tables, W&B",
    "analyze": "attention analyses of a checkpoint or a timm ViT",
    "data": "prepare image data ahead of time, show what is prepared",
    "sync": "upload the offline W&B runs under a path",
    "bench": "benchmarks with ratios against peers run in the same process",
}


def _tool(name: str):
    return import_module(TOOLS[name]).main


def commands_help() -> str:
    """The commands beside Lightning's, one a line (``repro --help`` prints them first)."""
    width = max(map(len, TOOLS))
    lines = [f"  {name.ljust(width)}  {SUMMARIES.get(name, '')}".rstrip() for name in TOOLS]
    return ("repro COMMAND --help for each command's options. Commands:\n" + "\n".join(lines)
            + "\nand Lightning's fit, validate, test, predict (below).\n")


def dispatch(argv: Sequence[str], *, from_command_line: bool = False) -> int | None:
    argv = list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(commands_help(), flush=True)
    if argv and argv[0] in TOOLS:
        tool = _tool(argv[0])
        with argparse_errors():  # their argparse errors end in the same one line
            return tool(argv[1:])
    from reproductions.run.cli import main as cli_main

    try:
        _fit(cli_main, argv, from_command_line)
    except stop.StopRequested as e:  # before the run took charge of it: parsing, building the model
        what = "training" if argv[:1] == ["fit"] else (argv[:1] or ["the command"])[0]
        raise RunInterrupted(f"stopped by {e.name} before {what} started; nothing to resume; rerun the same "
                             "command to start again", signum=e.signum) from e
    return None


def _fit(cli_main, argv: list[str], from_command_line: bool) -> None:
    # From the command line LightningCLI reads sys.argv itself (given both, it warns on every run).
    if from_command_line:
        sys.argv[1:] = argv  # without --debug: the DDP launcher restarts this command from sys.argv
        cli_main(None)
    else:
        cli_main(argv)


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = stop.install()  # first: a signal from here on stops the command with one line
    try:
        debug = pop_debug_flag(argv)
        return run_command(lambda a: dispatch(a, from_command_line=from_command_line), argv, debug=debug)
    finally:
        stop.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
