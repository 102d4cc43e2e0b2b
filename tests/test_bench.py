"""The trainer benchmark runs both sides on the same batches and reports ratios (not a timing test)."""

import json

from reproductions.bench import main


def test_trainer_benchmark_writes_paired_ratios(tmp_path, capsys):
    out = tmp_path / "trainer.json"
    main(["trainer", "--img-size", "8", "--patch-size", "2", "--embed-dim", "16", "--depth", "1",
          "--num-heads", "2", "--batch-size", "8", "--steps", "4", "--rounds", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["lightning_images_per_sec"]) == len(result["plain_images_per_sec"]) == 2
    assert all(r > 0 for r in result["lightning_images_per_sec"] + result["plain_images_per_sec"])
    assert len(result["paired_ratios"]) == 2 and result["median_paired_ratio"] > 0
    assert result["ratio_lightning_over_plain"] == result["median_lightning"] / result["median_plain"]
    assert "ratio of medians" in capsys.readouterr().out
