"""notebooks/: every notebook runs top to bottom on a tiny model (nbclient, a real kernel)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "vit_attention_analysis.ipynb"


def test_attention_notebook_is_thin_and_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert all(not c.get("outputs") for c in code), "commit the notebook without outputs"
    body = "\n".join(c.source for c in code)
    assert "def " not in body and "class " not in body, "logic belongs in analysis/, not the notebook"


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
