"""notebooks/: each is committed with the outputs of a real run, small and thin, and still runs top to
bottom on small inputs (nbclient, a real kernel) without rewriting the committed file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
NOTEBOOK = NOTEBOOKS / "vit_attention_analysis.ipynb"
BST_NOTEBOOK = NOTEBOOKS / "bst_results.ipynb"
MAX_BYTES = 1_000_000  # outputs included: keep the figures' dpi modest
ANALYSIS_FIGURES = ("attention_distance", "rollout", "position_similarity", "patch_filters_pca")


def outputs_of(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def text_of(outputs) -> str:
    """Printed text and displayed markdown, in order."""
    return "\n".join(o.get("text", "") + o.get("data", {}).get("text/markdown", "") for o in outputs)


def images_of(outputs) -> list:
    return [o for o in outputs if "image/png" in o.get("data", {})]


def execute_copy(path: Path):
    """Execute an in-memory copy of the notebook at ``path``; the file itself must stay as committed."""
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    for cell in nb.cells:  # run from a clean slate: no committed output may pass for a new one
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, f"executing rewrote {path.name}"
    outputs = outputs_of(nb)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    return nb


@pytest.mark.parametrize("notebook, library", [("vit_attention_analysis.ipynb", "analysis/"),
                                               ("bst_results.ipynb", "reproductions/sweeping/")])
def test_committed_notebook_is_thin_small_and_shows_its_results(notebook, library):
    path = NOTEBOOKS / notebook
    assert path.stat().st_size < MAX_BYTES, f"{notebook} is {path.stat().st_size} bytes; draw smaller figures"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    body = "\n".join(c.source for c in code)
    assert "def " not in body and "class " not in body, f"logic belongs in {library}, not the notebook"
    # saved after one clean run, top to bottom, without errors
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "run all cells once, in order"
    outputs = outputs_of(nb)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = text_of(outputs)
    assert str(REPO) not in text and "/tmp/" not in text, "the outputs name a folder of the machine that ran them"
    if notebook == "vit_attention_analysis.ipynb":  # the shipped checkpoint on Fashion-MNIST
        assert "ViT fmnist_vit_p4 | 128 images of fashion_mnist (val split), 28x28" in text
        assert "mean attention distance (pixels)" in text
        assert len(images_of(outputs)) == 4
    else:
        assert "### bst/table (" in text and "### bst/position (" in text
        assert "| WDL | " in text and "RelaImpr vs WDL (%)" in text
        assert not [o for o in outputs if "Missing or failed runs" in o.get("data", {}).get("text/markdown", "")]
        assert len(images_of(outputs)) == 2


@pytest.mark.notebook
def test_attention_notebook_runs_on_the_shipped_checkpoint(tmp_path, monkeypatch):
    """The default model (no ANALYSIS_CKPT / ANALYSIS_TIMM), on fewer images; the inputs go in through
    the environment, which the kernel inherits. (The overrides: tests/test_analysis_cli.py, load_target.)"""
    out = tmp_path / "analysis"
    for var in ("ANALYSIS_CKPT", "ANALYSIS_TIMM", "ANALYSIS_DATA_SOURCE", "ANALYSIS_SPLIT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANALYSIS_NUM_IMAGES", "8")
    monkeypatch.setenv("ANALYSIS_OUT", str(out))
    nb = execute_copy(NOTEBOOK)
    outputs = outputs_of(nb)
    assert "ViT fmnist_vit_p4 | 8 images of fashion_mnist (val split), 28x28" in text_of(outputs)
    assert len(images_of(outputs)) == 4  # distance, rollout, position similarity, filters
    for name in ANALYSIS_FIGURES:
        assert (out / f"{name}.png").is_file() and (out / f"{name}.json").is_file()
    distance = json.loads((out / "attention_distance.json").read_text())
    (model,) = distance["models"].values()
    assert model["num_images"] == 8 and model["grid_size"] == [7, 7]
    assert model["origin"] == "reproductions/vit/demo/fmnist_vit_p4.ckpt"


@pytest.mark.slow
@pytest.mark.notebook
def test_bst_results_notebook_draws_the_reports_of_smoke_sweeps(tmp_path, monkeypatch):
    """Both BST sweeps at the smoke profile (in this process), then the notebook on their results."""
    from tests.sweep_helpers import run_smoke_sweeps

    monkeypatch.setenv("BEHAVIOR_CACHE_DIR", str(tmp_path / "behavior-cache"))
    runs, figures = tmp_path / "runs", tmp_path / "figures"
    run_smoke_sweeps(runs)
    monkeypatch.setenv("BST_SWEEPS", "bst/table,bst/position")
    monkeypatch.setenv("BST_PROFILE", "smoke")
    monkeypatch.delenv("BST_SEEDS", raising=False)
    monkeypatch.setenv("BST_RUNS_ROOT", str(runs))
    monkeypatch.setenv("BST_FIGURES", str(figures))
    nb = execute_copy(BST_NOTEBOOK)
    outputs = outputs_of(nb)
    markdown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "### bst/table (smoke)" in markdown and "### bst/position (smoke)" in markdown
    assert "| WDL | " in markdown and "RelaImpr vs WDL (%)" in markdown and "ceiling: true click probabilities" in markdown
    assert "claimed: BST-b1 > DIN > WDL+Seq > WDL" in markdown
    assert len(images_of(outputs)) == 2  # one figure per sweep: AUC and GAUC bars with the ceiling
    assert (figures / "model.png").is_file() and (figures / "position.png").is_file()
