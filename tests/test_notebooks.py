"""notebooks/: every notebook runs top to bottom on a tiny model (nbclient, a real kernel)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "vit_attention_analysis.ipynb"


@pytest.mark.parametrize("notebook, library", [("vit_attention_analysis.ipynb", "analysis/"),
                                               ("bst_results.ipynb", "reproductions/sweeping/")])
def test_notebook_is_thin_and_has_no_outputs(notebook, library):
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert all(not c.get("outputs") for c in code), "commit the notebook without outputs"
    body = "\n".join(c.source for c in code)
    assert "def " not in body and "class " not in body, f"logic belongs in {library}, not the notebook"


def test_attention_notebook_runs_on_a_tiny_timm_model(tmp_path, monkeypatch):
    """Inputs go in through the environment, which the kernel inherits."""
    out = tmp_path / "analysis"
    monkeypatch.setenv("ANALYSIS_TIMM", "vit_tiny_patch16_224")
    monkeypatch.setenv("ANALYSIS_IMG_SIZE", "32")
    monkeypatch.setenv("ANALYSIS_NUM_IMAGES", "8")
    monkeypatch.setenv("ANALYSIS_OUT", str(out))
    monkeypatch.delenv("ANALYSIS_CKPT", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}},
    )
    client.execute()
    text = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert "vit_tiny_patch16_224 | 8 images of digits" in text
    assert len(images) == 4  # distance, rollout, position similarity, filters
    for name in ("attention_distance", "rollout", "position_similarity", "patch_filters_pca"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.json").is_file()
    distance = json.loads((out / "attention_distance.json").read_text())
    assert distance["models"]["vit_tiny_patch16_224"]["num_images"] == 8


BST_NOTEBOOK = REPO / "notebooks" / "bst_results.ipynb"


@pytest.mark.slow
def test_bst_results_notebook_draws_the_reports_of_smoke_sweeps(tmp_path, monkeypatch):
    """Both BST sweeps at the smoke profile (in this process), then the notebook on their results."""
    from tests.test_bst_experiments import run_smoke_sweeps

    monkeypatch.setenv("BEHAVIOR_CACHE_DIR", str(tmp_path / "behavior-cache"))
    runs, figures = tmp_path / "runs", tmp_path / "figures"
    run_smoke_sweeps(runs)
    monkeypatch.setenv("BST_SWEEPS", "bst/table,bst/position")
    monkeypatch.setenv("BST_PROFILE", "smoke")
    monkeypatch.setenv("BST_RUNS_ROOT", str(runs))
    monkeypatch.setenv("BST_FIGURES", str(figures))
    nb = nbformat.read(BST_NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    markdown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert "### bst/table (smoke)" in markdown and "### bst/position (smoke)" in markdown
    assert "| WDL | " in markdown and "RelaImpr vs WDL (%)" in markdown and "ceiling: true click probabilities" in markdown
    assert "claimed: BST-b1 > DIN > WDL+Seq > WDL" in markdown
    assert len(images) == 2  # one figure per sweep: AUC and GAUC bars with the ceiling
    assert (figures / "model.png").is_file() and (figures / "position.png").is_file()
