"""Plans (reproductions/sweeping/plan.py): the runs' commands, launchers and devices, override
values on the command line, and the paths the runs see from any working directory."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml

from reproductions.sweeping.plan import cli_value, make_plan, run_path
from reproductions.sweeping.spec import SweepError
from tests.sweep_helpers import REPO


def test_cli_values_parse_back():
    assert cli_value(0.001) == "0.001" and cli_value(3) == "3" and cli_value(False) == "false"
    assert cli_value("learned_2d") == "learned_2d" and cli_value(None) == "null"
    assert cli_value("true") == '"true"' and cli_value("1") == '"1"'  # strings that YAML would retype
    assert yaml.safe_load(cli_value([1, 2])) == [1, 2]


def test_devices_and_launchers_in_the_commands(tmp_path):
    plan = make_plan("vit/attention", "smoke", root=tmp_path, devices=2, launcher="torchrun", wandb=True)
    cmd = plan.runs[0].command
    assert cmd[:8] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       "-m", "reproductions"]  # fmt: skip
    joined = shlex.join(cmd)
    assert "--trainer.devices 2 --trainer.strategy ddp" in joined and "--run.wandb true" in joined
    one = make_plan("vit/attention", "smoke", root=tmp_path, devices=1)
    assert "--trainer.devices 1" in shlex.join(one.runs[0].command) and "strategy" not in shlex.join(one.runs[0].command)
    with pytest.raises(SweepError, match="one at a time"):
        make_plan("vit/attention", "smoke", devices=2, jobs=2)


def test_run_paths_are_as_given_in_the_repository_root_and_absolute_elsewhere(tmp_path, monkeypatch):
    """The runs run in the repository root: from there the commands keep the paths as given
    (relative config and root); from another directory those paths are made absolute, while
    the plan's own run directories stay as given (this process reads them)."""
    monkeypatch.chdir(REPO)
    args = make_plan("vit/attention", "smoke", root="runs").runs[0].args
    assert args[2] == "reproductions/vit/configs/digits.yaml"
    assert args[args.index("--run.root") + 1] == "runs"
    monkeypatch.chdir(tmp_path)
    plan = make_plan("vit/attention", "smoke", root="runs")
    args = plan.runs[0].args
    assert args[2] == str(REPO / "reproductions/vit/configs/digits.yaml")
    assert args[args.index("--run.root") + 1] == str(tmp_path / "runs")
    assert plan.runs[0].run_dir == Path("runs/vit/attention-smoke/dot/seed0")
    assert run_path("runs") == str(tmp_path / "runs") and run_path("/abs/runs") == "/abs/runs"
