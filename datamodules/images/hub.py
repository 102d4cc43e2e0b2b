"""Hugging Face Hub access that fails fast offline.

``load_hub_dataset`` decides once per call whether the hub can be used: the offline switches
(``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``, read now rather than at import) and,
when none is set, a TCP probe of the endpoint bounded to a few seconds. Offline it loads from the local cache
only (``offline_mode``) and turns a miss into ``HubDatasetUnavailableError``, which says how to get the data,
instead of the libraries' minutes of retries (the probe: ``utils.net.connection_problem``). ``offline_mode`` and
``TRUE_VALUES`` are also used for pretrained weights (``reproductions/commands/analysis_inputs.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import datasets
import huggingface_hub.constants

from utils.net import connection_problem

HUB_PROBE_TIMEOUT_S = 3.0
TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})
"""Values of an offline switch (upper-cased, stripped) that turn it on."""


def hub_offline() -> tuple[bool, str]:
    """(offline?, why), reading the environment now (the libraries read it once, at import time)."""
    value = os.environ.get("HF_DATASETS_OFFLINE")
    var = "HF_DATASETS_OFFLINE"
    if value is None:
        var = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value:
        return value.strip().upper() in TRUE_VALUES, f"{var}={value}"
    if datasets.config.HF_HUB_OFFLINE:
        return True, "datasets.config.HF_HUB_OFFLINE is set"
    endpoint = huggingface_hub.constants.ENDPOINT
    problem = connection_problem(endpoint, HUB_PROBE_TIMEOUT_S)
    if problem is not None:
        return True, f"{endpoint} is unreachable: {problem}"
    return False, f"{endpoint} is reachable"


@contextlib.contextmanager
def offline_mode(enabled: bool) -> Iterator[None]:
    """Switch ``datasets`` and ``huggingface_hub`` to offline mode for the duration of the block."""
    if not enabled:
        yield
        return
    saved = (
        datasets.config.HF_HUB_OFFLINE,
        datasets.config.HF_DATASETS_OFFLINE,
        huggingface_hub.constants.HF_HUB_OFFLINE,
    )
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        (
            datasets.config.HF_HUB_OFFLINE,
            datasets.config.HF_DATASETS_OFFLINE,
            huggingface_hub.constants.HF_HUB_OFFLINE,
        ) = saved


class HubDatasetUnavailableError(FileNotFoundError):
    """A hub dataset is not in the local cache and the hub cannot be used; ``why`` says why not."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def load_hub_dataset(name: str, cache_dir: Path) -> datasets.DatasetDict:
    """``datasets.load_dataset(name)``; offline or unreachable hub: from the cache, or a clear error in seconds."""
    offline, why = hub_offline()
    try:
        with offline_mode(offline):
            return datasets.load_dataset(name, cache_dir=str(cache_dir))
    except (ConnectionError, FileNotFoundError) as e:
        if not offline:
            raise
        raise HubDatasetUnavailableError(
            f"hub dataset {name!r} is not in the local datasets cache ({cache_dir}) and the Hugging Face Hub "
            f"cannot be used ({why}). To get it: run once with network access (it is then cached there), or copy "
            f"a filled cache into that directory (cache_dir or HF_DATASETS_CACHE selects it), or use a local "
            f"source (source=folder, data_dir=...). Underlying error: {type(e).__name__}: {e}",
            why,
        ) from e
