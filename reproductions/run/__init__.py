"""One training run's lifecycle, under every ``repro fit / validate / test / predict``.

- ``cli``: ``ReproductionCLI``, LightningCLI with the run directory, seeds, resume, W&B and results;
- ``options``: the ``run:`` group of a config (where, what it is called, W&B); ``run_config``: parsing
  fixes, config.yaml and the W&B config;
- ``failures`` and ``finish``: the parts of ``ReproductionCLI`` that end a subcommand (a failure or
  interruption; the test, results.json and W&B after a fit);
- ``rundir``: the run directory, its lock and its state; ``results``: results.json and hardware;
- ``ckpt_paths`` and ``model_check``: which checkpoint a run resumes or tests, and that it fits the model;
- ``tracking`` and ``artifacts``: W&B (online, offline or off) and what a run keeps there;
- ``rendezvous`` (DDP/SLURM), ``signals`` (SIGTERM/SIGUSR1 preemption), ``quiet`` (known warnings);
- ``errors``: the one-line ``error: ...`` every command ends with.

The commands (``reproductions.commands``), the sweep engine (``reproductions.sweeping``) and the
benchmarks (``reproductions.benchmarks``) build on these; nothing here imports them.
"""
