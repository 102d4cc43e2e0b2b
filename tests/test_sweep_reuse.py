"""``sweep --reuse`` (reproductions/sweeping/reuse.py): a run whose resolved config and seed equal a
finished run's in another experiment is copied from it, not trained; anything else trains."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from reproductions.run.results import RESULTS_FILE, hardware, read_results
from reproductions.commands.sweep import main as sweep_main
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.reuse import config_key, copy_run, finished_runs, resolve_config, reuse_finished
from tests.helpers import inprocess_runner
from tests.sweep_helpers import write_sweep

ALIASES = {"patch_size": "model.net.init_args.patch_size"}


def _sweeps(tmp_path):
    """A: patch 4 and patch 2 given explicitly. B: patch 4 again, the base config's default patch
    (2: the same resolved config as A's p2, from other arguments) and patch 1 (new)."""
    a = write_sweep(tmp_path / "a.yaml", title="A", aliases=ALIASES,
                    variants=[{"name": "p4", "overrides": {"patch_size": 4}},
                              {"name": "p2", "overrides": {"patch_size": 2}}])  # fmt: skip
    b = write_sweep(tmp_path / "b.yaml", title="B", aliases=ALIASES,
                    variants=[{"name": "four", "overrides": {"patch_size": 4}}, {"name": "default", "overrides": {}},
                              {"name": "one", "overrides": {"patch_size": 1}}])  # fmt: skip
    return a, b


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Sweep A run for real (in this process) once for the tests that need finished runs."""
    tmp = tmp_path_factory.mktemp("reuse")
    a, b = _sweeps(tmp)
    root = tmp / "runs"
    assert sweep_main([str(a), "--profile", "smoke", "--root", str(root)], runner=inprocess_runner,
                      out=io.StringIO()) == 0  # fmt: skip
    return a, b, root


@pytest.mark.xdist_group("sweep_reuse")
def test_equal_configs_are_copied_and_the_rest_trains(swept):
    a, b, root = swept
    calls = []

    def runner(run, env):
        calls.append(run.label)
        return inprocess_runner(run, env)

    # the dry run names what it would copy and copies nothing
    out = io.StringIO()
    assert sweep_main([str(b), "--profile", "smoke", "--root", str(root), "--reuse", "--dry-run"], runner=runner,
                      out=out) == 0  # fmt: skip
    text = out.getvalue()
    assert "would reuse four seed0: from " in text and "would reuse default seed0: from " in text
    assert "--reuse: 2 of the runs to run would be copied" in text and "# 3/3 one seed0 (run)" in text
    assert calls == [] and not (root / "b-smoke").exists()

    out = io.StringIO()
    assert sweep_main([str(b), "--profile", "smoke", "--root", str(root), "--reuse"], runner=runner, out=out) == 0
    assert calls == ["one seed0"], out.getvalue()
    assert "1 finished, 0 failed, 0 skipped (already finished), 2 reused" in out.getvalue()
    planned = {r.variant.name: r for r in make_plan(b, "smoke", root=root).runs}
    for name, source in (("four", "p4"), ("default", "p2")):
        src, dst = root / "a-smoke" / source / "seed0", root / "b-smoke" / name / "seed0"
        res, orig = read_results(dst), read_results(src)
        assert res["test"] == orig["test"] and res["training"] == orig["training"] and res["git"] == orig["git"]
        assert res["variant"] == name and res["experiment"] == "b-smoke" and res["run_dir"] == str(dst)
        assert res["reused_from"] == {"run_dir": str(src), "command": orig["command"]}
        assert res["command"] == "python -m reproductions " + " ".join(planned[name].args)
        assert res["best"]["path"].startswith(str(dst.resolve())) and (dst / "checkpoints").is_dir()
        assert sorted(p.name for p in (dst / "checkpoints").iterdir()) == sorted(
            p.name for p in (src / "checkpoints").iterdir())
        cfg = yaml.safe_load((dst / "config.yaml").read_text())
        assert cfg["run"]["experiment"] == "b-smoke" and cfg["run"]["variant"] == name
        assert config_key(cfg) == config_key(yaml.safe_load((src / "config.yaml").read_text()))
        assert (dst / "stdout.log").read_text().startswith(f"sweep --reuse: copied from {src} ")
        assert not list(dst.glob("run.lock*"))
    trained = read_results(root / "b-smoke" / "one" / "seed0")
    assert trained is not None and "reused_from" not in trained
    report = (root / "b-smoke" / "report.md").read_text()
    assert "None: every planned run finished." in report
    # the plan does not see the copies as made "with another command"
    assert {r.variant.name for r in make_plan(b, "smoke", root=root).changed()}.isdisjoint({"four", "default"})
    # run again: everything is finished, nothing is copied or trained
    out = io.StringIO()
    assert sweep_main([str(b), "--profile", "smoke", "--root", str(root), "--reuse", "--no-report"], runner=runner,
                      out=out) == 0 and calls == ["one seed0"]  # fmt: skip
    assert "3 already finished (skipped), 0 to run" in out.getvalue()


@pytest.mark.xdist_group("sweep_reuse")
def test_resolved_config_is_the_one_fit_writes(swept):
    """resolve_config dumps what fit's config.yaml holds; another seed or override is another key."""
    a, _, root = swept
    plan = make_plan(a, "smoke", root=root)
    p4 = plan.runs[0]
    written = yaml.safe_load((p4.run_dir / "config.yaml").read_text())
    assert yaml.safe_load(resolve_config(p4.args)) == written
    other_seed = [*p4.args[: p4.args.index("--seed_everything") + 1], "7", *p4.args[p4.args.index("--seed_everything") + 2:]]
    assert config_key(yaml.safe_load(resolve_config(other_seed))) != config_key(written)
    assert config_key(yaml.safe_load(resolve_config(plan.runs[1].args))) != config_key(written)
    own = {r.run_dir for r in plan.runs}
    assert own <= {d for dirs in finished_runs(root).values() for d in dirs}
    assert own.isdisjoint(d for dirs in finished_runs(root, exclude=list(own)).values() for d in dirs)


def _finished(run_dir, config: dict, acc: float = 0.5, hw: dict | str | None = "here"):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (run_dir / "stdout.log").write_text("trained\n")
    (run_dir / "run.lock").write_text("{}")
    res = {"status": "finished", "variant": "x", "seed": 0, "test": {"test/acc": acc}, "command": "python -m x",
           "best": {"path": str((run_dir / "checkpoints" / "last.ckpt").resolve())}}  # fmt: skip
    if hw is not None:
        res["hardware"] = hardware("cpu") if hw == "here" else hw
    (run_dir / RESULTS_FILE).write_text(json.dumps(res))


def test_what_is_compared_and_where_copying_stops(tmp_path):
    """The run section and config paths are left out of the comparison; unfinished runs and
    validate/test subdirectories are not sources; a run directory with checkpoints of its own
    resumes instead of being overwritten; a config that cannot be resolved trains."""
    root = tmp_path / "runs"
    base = {"seed_everything": 0, "model": {"lr": 1.0}, "ckpt_path": None}
    _finished(root / "p/one-x/v/seed0", {**base, "run": {"experiment": "p/one-x"}, "config": ["a.yaml"]})
    unfinished = root / "p/one-x/w/seed0"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text(yaml.safe_dump({**base, "model": {"lr": 2.0}}))
    _finished(root / "p/one-x/v/seed0/test", {**base, "model": {"lr": 3.0}})
    index = finished_runs(root)
    assert list(index.values()) == [[root / "p/one-x/v/seed0"]]
    assert config_key({**base, "run": {"experiment": "other"}, "config": ["b.yaml"]}) in index

    plan = make_plan(write_sweep(tmp_path / "s.yaml", title="S", aliases=ALIASES,
                                 variants=[{"name": "a", "overrides": {"patch_size": 4}},
                                           {"name": "b", "overrides": {"patch_size": 2}},
                                           {"name": "c", "overrides": {"patch_size": 1}}]),
                     "smoke", root=root)  # fmt: skip
    a, b, c = plan.runs
    (b.run_dir / "checkpoints").mkdir(parents=True)
    (b.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"earlier attempt")

    def resolve(args):
        if args == c.args:
            raise ValueError("bad value")
        return yaml.safe_dump({**base, "run": {"experiment": "s-smoke"}})

    out = io.StringIO()
    reused = reuse_finished(plan.runs, root, own=[r.run_dir for r in plan.runs], out=out, resolve=resolve)
    assert [r.run.label for r in reused] == ["a seed0"], out.getvalue()
    assert "could not resolve the config of c seed0 (ValueError: bad value); it will train" in out.getvalue()
    assert (b.run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"earlier attempt"
    assert read_results(b.run_dir) is None
    res = read_results(a.run_dir)
    assert res["test"] == {"test/acc": 0.5} and res["best"]["path"] == str((a.run_dir / "checkpoints/last.ckpt").resolve())
    assert not (a.run_dir / "run.lock").exists() and (a.run_dir / "checkpoints/last.ckpt").read_bytes() == b"weights"


def test_a_copy_interrupted_before_its_results_is_not_finished(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    base = {"seed_everything": 0, "model": {"lr": 1.0}}
    src = root / "p/one-x/v/seed0"
    _finished(src, base)
    plan = make_plan(write_sweep(tmp_path / "s.yaml", title="S", aliases=ALIASES,
                                 variants=[{"name": "a", "overrides": {"patch_size": 4}}]), "smoke", root=root)  # fmt: skip
    run = plan.runs[0]

    def crash(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("reproductions.sweeping.reuse.write_results", crash)
    try:
        copy_run(src, run, yaml.safe_dump(base))
    except OSError:
        pass
    assert read_results(run.run_dir) is None and not (run.run_dir / RESULTS_FILE).exists()
    assert read_results(src) is not None


def test_a_twin_from_other_hardware_trains(tmp_path):
    """The same config and seed on another CPU type (or with no hardware recorded) is another
    draw, not a copy: such a twin is named and the run trains; a twin from this machine's
    hardware, found later in path order, is the one copied."""
    root = tmp_path / "runs"
    base = {"seed_everything": 0, "model": {"lr": 1.0}, "trainer": {"accelerator": "cpu"}}
    here = hardware("cpu")
    other = {**here, "cpu_capability": "AVX2" if here["cpu_capability"] != "AVX2" else "AVX512"}
    _finished(root / "p/a-x/v/seed0", {**base, "run": {"experiment": "p/a-x"}}, acc=0.1, hw=other)
    _finished(root / "p/b-x/v/seed0", {**base, "run": {"experiment": "p/b-x"}}, acc=0.2, hw=None)
    plan = make_plan(write_sweep(tmp_path / "s.yaml", title="S", aliases=ALIASES,
                                 variants=[{"name": "a", "overrides": {"patch_size": 4}}]), "smoke", root=root)
    (run,) = plan.runs

    def resolve(args):
        return yaml.safe_dump({**base, "run": {"experiment": "s-smoke"}})

    out = io.StringIO()
    assert reuse_finished(plan.runs, root, own=[run.run_dir], out=out, resolve=resolve) == []
    text = out.getvalue()
    assert f"has a finished twin, {root / 'p/a-x/v/seed0'}, trained on CPU {here['cpu']} ({other['cpu_capability']})" in text
    assert f"not on this machine's CPU {here['cpu']} ({here['cpu_capability']}); the numbers would differ, so it trains" in text
    assert read_results(run.run_dir) is None

    _finished(root / "p/c-x/v/seed0", {**base, "run": {"experiment": "p/c-x"}}, acc=0.3)  # this machine's
    reused = reuse_finished(plan.runs, root, own=[run.run_dir], out=io.StringIO(), resolve=resolve)
    assert [r.source for r in reused] == [root / "p/c-x/v/seed0"] and read_results(run.run_dir)["test"]["test/acc"] == 0.3


def test_same_hardware():
    """GPU runs match on the GPU model, CPU runs on the CPU and its instruction set; a missing
    record or field matches nothing."""
    from reproductions.run.results import same_hardware

    cpu = {"device": "cpu", "cpu": "AMD EPYC (family 25, model 1)", "cpu_capability": "AVX2"}
    assert same_hardware(cpu, dict(cpu))
    assert not same_hardware(cpu, {**cpu, "cpu_capability": "AVX512"})
    assert not same_hardware(cpu, {**cpu, "cpu": "AMD EPYC (family 26, model 2)"})
    assert not same_hardware(cpu, None) and not same_hardware(None, None)
    assert not same_hardware({"device": "cpu"}, {"device": "cpu"})
    gpu = {"device": "cuda", "gpu": "NVIDIA H100", "cpu": "x", "cpu_capability": "AVX2"}
    assert same_hardware(gpu, {**gpu, "cpu": "y", "cpu_capability": "AVX512"})
    assert not same_hardware(gpu, {**gpu, "gpu": "NVIDIA A100"}) and not same_hardware(gpu, cpu)
