"""The repository's shape: the import graph (tests/import_graph.py) and docs that stand alone."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.import_graph import REPO, cycles, graph, layer_violations, private_imports


@pytest.fixture(scope="module")
def import_graph():
    return graph()


def test_graph_sees_the_repository(import_graph):
    # a guard for the checks below: the parser finds the modules and their imports
    assert "reproductions.cli" in import_graph and "models.vit" in import_graph
    assert "models.position" in import_graph["models.vit"]


def test_no_import_cycles(import_graph):
    assert cycles(import_graph) == []


def test_cycle_detection_finds_a_cycle():
    assert cycles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]


def test_layers_import_one_way(import_graph):
    assert layer_violations(import_graph) == []


def test_no_private_names_imported_across_modules(import_graph):
    assert private_imports(import_graph) == []


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


#: what a user who clones the repository cannot follow: paths outside it, our issue tracker
_OUTSIDE = re.compile(r"\.\./shared|\bissue #?\d+|\(issue|\bwas lent\b|\blent to\b", re.IGNORECASE)


def test_docs_code_and_configs_stand_alone():
    hits = []
    for name in _tracked_files():
        if name.startswith(("tests/", ".ci/")) or not name.endswith((".py", ".md", ".yaml", ".ipynb", ".sh", ".toml", ".txt")):
            continue
        for number, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
    assert hits == []
