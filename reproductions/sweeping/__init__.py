"""Ablation sweeps and their reports, in layers that import one way (each only the ones listed before it):

    spec      sweep files: Sweep, Profile (and its Scale), Variant, Metric, Reference; load_sweep, find_sweep
    plan      a sweep at one profile: Plan, Run, make_plan, the runs' commands
    launch    running the runs (subprocesses, progress, SLURM job arrays)
    collect   their results.json per variant: VariantResults, Stat, mean_std
    tables    the report table, number formats, RelaImpr, shared report options
    checks    the claim checks (report.check): lines and their comparisons (claim, a - b, s.e., verdict)
    figures   the figure (report.plot), one function per plot kind; a claim against the scale
    sweep_report  report.md, stdout and W&B: build_report, render, write_report, log_to_wandb
    claims_page  every sweep's claims at every profile's scale on one page: gather, build_page, write_page

The commands ``repro sweep``, ``report`` and ``claims`` are ``reproductions/commands/sweep.py``,
``reproductions/commands/report.py`` and ``reproductions/commands/claims.py``. (The per-paper
``reproductions/<paper>/sweeps/`` folders hold the sweep files this package reads.)
"""
