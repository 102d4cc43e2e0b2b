"""reproductions.run.results: a run directory's state, with a corrupt results.json named as corrupt."""

from __future__ import annotations

import json

from reproductions.run.results import RESULTS_FILE, main, read_results, results_state


def test_states_of_a_run_directory(tmp_path, capsys):
    assert results_state(tmp_path) == ("missing", None) and main([str(tmp_path)]) == 1
    finished = {"status": "finished", "test": {"test/acc": 0.5}}
    (tmp_path / RESULTS_FILE).write_text(json.dumps(finished))
    assert results_state(tmp_path) == ("finished", finished) and read_results(tmp_path) == finished
    assert main([str(tmp_path)]) == 0
    (tmp_path / RESULTS_FILE).write_text(json.dumps({"status": "failed", "error": "nan"}))
    assert results_state(tmp_path)[0] == "failed" and read_results(tmp_path) is None and main([str(tmp_path)]) == 1
    text = json.dumps(finished)
    (tmp_path / RESULTS_FILE).write_text(text[: len(text) // 2])  # cut in half: corrupt, not "finished"
    assert results_state(tmp_path) == ("corrupt", None) and read_results(tmp_path) is None
    capsys.readouterr()
    assert main([str(tmp_path)]) == 2
    assert "is corrupt" in capsys.readouterr().err


def test_metric_value_reads_test_metrics_and_dotted_paths():
    """A sweep metric: ``stage/name`` from the test metrics; a dotted path anywhere else, also one
    whose last part is a metric name with a ``/`` (``final.val/acc``, the last validation value)."""
    from reproductions.run.results import metric_value

    res = {"test": {"test/acc": 0.8}, "final": {"val/acc": 0.91, "train/loss": 0.3}, "best": {"score": 0.92}}
    assert metric_value(res, "test/acc") == 0.8
    assert metric_value(res, "final.val/acc") == 0.91
    assert metric_value(res, "best.score") == 0.92
    assert metric_value(res, "val/acc") is None  # not a test metric, and no dotted path
    assert metric_value(res, "final.val/auc") is None and metric_value(res, "nothing.here") is None


def test_cpu_flags_and_name_read_one_cpuinfo():
    """cpu_flags answers for every flag asked (False for one no CPU has); cpu_name names the CPU."""
    from pathlib import Path

    from reproductions.run.results import cpu_flags, cpu_name

    from tests.helpers import cpu_flags_listed

    flags = cpu_flags(["avx2", "no_such_flag"])
    if not cpu_flags_listed():
        assert flags == {}
        return
    assert flags["no_such_flag"] is False and set(flags) == {"avx2", "no_such_flag"}
    text = Path("/proc/cpuinfo").read_text()
    assert flags["avx2"] == (" avx2" in text)
    assert cpu_name() and cpu_name() != "unknown"


def test_hardware_summary_names_one_machine_alone_and_counts_each_of_several():
    """The line a README table or a reference gives for where its runs were computed: a campaign continued on
    another machine names each kind of hardware with its count, most runs first."""
    from reproductions.run.results import hardware_summary

    xeon = {"hardware": {"device": "cpu", "cpu": "Xeon", "cpu_capability": "AVX512"}}
    epyc = {"hardware": {"device": "cpu", "cpu": "EPYC", "cpu_capability": "AVX2"}}
    gpu = {"hardware": {"device": "cuda", "gpu": "H100", "cuda": "13.0", "cpu": "EPYC"}}
    assert hardware_summary([]) == "–"
    assert hardware_summary([xeon, xeon]) == "CPU Xeon (AVX512)"
    assert hardware_summary([epyc, xeon, xeon]) == "CPU Xeon (AVX512) (2 runs); CPU EPYC (AVX2) (1 run)"
    assert hardware_summary([gpu, {}]) == ("GPU H100 (CUDA 13.0), CPU EPYC (1 run); "
                                           "not recorded (results.json from before the hardware record) (1 run)")
