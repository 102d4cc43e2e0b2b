"""Entry point: ``python -m reproductions <command> ...``.

Commands:
    fit, validate, test, predict   Lightning's subcommands through ReproductionCLI (``--help`` on each)
    bench                          benchmarks that print ratios against a same-run reference
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from reproductions.bench import main as bench_main

        return bench_main(argv[1:])
    from reproductions.cli import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
