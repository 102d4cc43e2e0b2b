"""Ablation sweeps and their reports, in layers that import one way (each only the ones listed before it):

    spec      sweep files: Sweep, Profile, Variant, Metric, Reference; load_sweep, find_sweep
    plan      a sweep at one profile: Plan, Run, make_plan, the runs' commands
    launch    running the runs (subprocesses, progress, SLURM job arrays)
    collect   their results.json per variant: VariantResults, Stat, mean_std
    tables    the report table, number formats, RelaImpr, shared report options
    claims    the claim checks (report.check)
    figures   the figure (report.plot), one function per plot kind
    report    report.md, stdout and W&B: build_report, render, write_report, log_to_wandb

The commands ``repro sweep`` and ``report`` are ``reproductions/sweep.py``
and ``reproductions/report.py``. (The per-paper ``reproductions/<paper>/sweeps/`` folders hold
the sweep files this package reads.)
"""
