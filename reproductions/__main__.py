"""Entry point: ``python -m reproductions <command> ...``.

Commands:
    fit, validate, test, predict   Lightning's subcommands through ReproductionCLI (``--help`` on each)
    sweep                          run an ablation grid (reproductions/sweep.py): variant x seed runs
    report                         a sweep's table beside the paper and its figures (reproductions/report.py)
    analyze                        attention analyses of a checkpoint or timm ViT (reproductions/analyze.py)
    bench                          benchmarks with ratios against peers run in the same process (reproductions/bench.py):
                                   trainer, vit, hybrid, data, bst, gpu
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int | None:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from reproductions.bench import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] == "sweep":
        from reproductions.sweep import main as sweep_main

        return sweep_main(argv[1:])
    if argv and argv[0] == "report":
        from reproductions.report import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "data":
        from reproductions.data import main as data_main
        return data_main(argv[1:])
    if argv and argv[0] == "analyze":
        from reproductions.analyze import main as analyze_main

        return analyze_main(argv[1:])
    from reproductions.cli import main as cli_main

    # From the command line LightningCLI reads sys.argv itself (given both, it warns on every run).
    cli_main(None if from_command_line else argv)
    return None


if __name__ == "__main__":
    sys.exit(main())
