"""The test suite's own machinery: what makes the default run fit its time."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("suite-grouping")
def test_xdist_groups_keep_their_tests_on_one_process(request):
    """Files with an expensive module fixture mark their tests ``xdist_group`` so that one test process
    computes it once (``--dist loadgroup``, pyproject.toml). pytest-xdist says a test's group in its node id;
    pytest 9.2 stopped taking that, so every group was spread over both processes and each fixture computed
    twice, silently (requirements-dev.txt pins the pytest that keeps it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under the default `-n 2 --dist loadgroup`")
    assert request.node.nodeid.endswith("@suite-grouping"), request.node.nodeid
