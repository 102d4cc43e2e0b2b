"""The repository's shape: the import graph (tests/import_graph.py) and docs that stand alone."""

from __future__ import annotations

import re
import subprocess

import pytest

import ast
from collections import defaultdict

from tests.import_graph import PACKAGES, REPO, cycles, graph, layer_violations, loose_modules, private_imports, repo_modules


@pytest.fixture(scope="module")
def import_graph():
    return graph()


def test_graph_sees_the_repository(import_graph):
    # a guard for the checks below: the parser finds the modules and their imports
    assert "reproductions.run.cli" in import_graph and "models.vit" in import_graph
    assert "models.position" in import_graph["models.vit"]


def test_no_import_cycles(import_graph):
    assert cycles(import_graph) == []


def test_cycle_detection_finds_a_cycle():
    assert cycles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]


def test_layers_import_one_way(import_graph):
    assert layer_violations(import_graph) == []


def test_rooms_of_reproductions_import_one_way():
    # the check sees a room importing upwards (the run importing the sweep engine) and across (two peers)
    assert layer_violations({"reproductions.run.cli": {"reproductions.sweeping.plan": []}}) == [
        "reproductions.run.cli imports reproductions.sweeping.plan: reproductions.run may import only no other room"]
    assert layer_violations({"reproductions.benchmarks.vit": {"reproductions.sweeping.plan": []}})
    assert layer_violations({"reproductions.commands.sweep": {"reproductions.sweeping.plan": [],
                                                              "reproductions.run.errors": []}}) == []  # fmt: skip


def test_reproductions_is_rooms_and_paper_folders():
    # every module lies in a room (run, commands, sweeping, benchmarks) or is the entry point; the paper
    # folders (vit, bst) hold configs, sweeps, Markdown, figures and the demo checkpoint, no Python
    assert loose_modules() == []
    assert sorted(p.name for p in (REPO / "reproductions").glob("*.py")) == ["__init__.py", "__main__.py"]
    for paper in ("vit", "bst"):
        assert list((REPO / "reproductions" / paper).rglob("*.py")) == [], paper


def test_one_name_per_thing():
    # no two modules of reproductions share a stem, none has the stem of a package, and no class
    # name is defined twice in the project's code
    stems, classes = defaultdict(list), defaultdict(list)
    packages = {p.parent.name for p in (REPO / "reproductions").rglob("__init__.py")}
    for name, path in repo_modules().items():
        if name.startswith("reproductions.") and path.stem not in ("__init__", "__main__"):
            stems[path.stem].append(name)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(name)
    assert {s: m for s, m in stems.items() if len(m) > 1 or s in packages} == {}
    assert {c: m for c, m in classes.items() if len(m) > 1} == {}
    assert set(PACKAGES) <= {n.split(".")[0] for n in repo_modules()}


def test_no_private_names_imported_across_modules(import_graph):
    assert private_imports(import_graph) == []


def test_test_files_share_helpers_through_helper_modules_only():
    # a test file's helpers that another test needs live in a helper module (cli_helpers, tiny_models,
    # resume_helpers, ...): no test file imports another, at its top or inside a test
    tests = REPO / "tests"
    hits = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            hits += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.startswith("tests.test_")]
    assert hits == []
    assert any(p.name == "cli_helpers.py" for p in tests.glob("*_helpers.py"))  # the check looks where helpers are


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
