"""Hub sources offline (``datamodules/images/hub.py``): fail fast and clearly; column and split choice."""

from __future__ import annotations

import socket
import time

import datasets
import huggingface_hub.constants
import pytest

import datamodules.images.sources as sources
from datamodules.images import ImageDataModule
from tests.images_helpers import cache, hub_like, isolated, make  # noqa: F401


@pytest.mark.parametrize(
    ("source", "name"), [("cifar10", "uoft-cs/cifar10"), ("someone/tiny-images", "someone/tiny-images")]
)
def test_offline_hub_load_fails_fast_and_clearly(cache, source, name):
    before = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    dm = ImageDataModule(cache_dir=cache, source=source)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as error:
        dm.prepare_data()
    assert time.monotonic() - start < 20
    message = str(error.value)
    assert name in message and "not in the local datasets cache" in message and "network" in message
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


def test_hub_sources_pick_their_columns_and_splits(cache, monkeypatch):
    loaded = []

    def fake_load(name, cache_dir):
        loaded.append(name)
        return hubs[name]

    hubs = {
        "uoft-cs/cifar100": hub_like(
            {"train": 30, "test": 8}, coarse_label=["c0", "c1"], fine_label=["f0", "f1", "f2"]
        ),
        "owner/pictures": hub_like(
            {"train": 20, "validation": 6}, image_column="picture", label=["a", "b"], other=list("xyz")
        ),
    }
    monkeypatch.setattr(sources, "load_hub_dataset", fake_load)
    dm = make(cache, source="cifar100")
    assert loaded[-1] == "uoft-cs/cifar100" and dm.class_names == ["f0", "f1", "f2"]  # fine, not coarse
    assert dm.input_shape == (3, 6, 6) and len(dm.test_dataset) == 8 and dm.describe()["test_split"] == "official test"
    assert dm.test_dataset.targets.tolist() == [i % 3 for i in range(8)]

    dm = make(cache, source="owner/pictures")  # first Image column, first ClassLabel column, validation as test
    assert dm.class_names == ["a", "b"] and len(dm.test_dataset) == 6
    assert dm.describe()["test_split"] == "official validation"
    assert make(cache, source="owner/pictures", label_column="other").class_names == ["x", "y", "z"]
    with pytest.raises(ValueError, match="no label column 'nope'.*set label_column"):
        make(cache, source="owner/pictures", label_column="nope")


def test_unreachable_hub_is_detected_by_the_probe(cache, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a local port nobody listens on: connections are refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"uoft-cs/cifar100.*unreachable"):
        ImageDataModule(cache_dir=cache, source="cifar100").prepare_data()
    assert time.monotonic() - start < 20
    assert datasets.config.HF_HUB_OFFLINE is False and huggingface_hub.constants.HF_HUB_OFFLINE is False



def test_offline_mode_switches_the_libraries_and_restores_them(monkeypatch):
    from datamodules.images.hub import TRUE_VALUES, offline_mode

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with offline_mode(True):
        assert datasets.config.HF_HUB_OFFLINE and huggingface_hub.constants.HF_HUB_OFFLINE
    assert datasets.config.HF_HUB_OFFLINE is False and huggingface_hub.constants.HF_HUB_OFFLINE is False
    with offline_mode(False):
        assert datasets.config.HF_HUB_OFFLINE is False
    assert {"1", "TRUE", "YES", "ON"} == TRUE_VALUES


def test_connection_probe_fails_fast_on_a_closed_port_and_names_why(monkeypatch):
    from utils.net import connection_problem

    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    assert connection_problem(f"http://127.0.0.1:{port}", timeout=2.0) == f"connection to 127.0.0.1:{port} refused"
    assert time.monotonic() - start < 1  # refused is known at once
    assert connection_problem("not a url") == "'not a url' names no host"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert connection_problem(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=2.0) is None
