"""Training order: a function of (Lightning global seed, epoch) and a position only, resumable mid-epoch,
split across processes (``datamodules/sampler.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

from datamodules.images import ImageDataModule
from datamodules.sampler import ResumableLoader, ResumableSampler
from tests.images_helpers import cache, isolated, make  # noqa: F401


def test_sampler_order_depends_only_on_seed_and_epoch():
    data = list(range(50))
    a, b = ResumableSampler(data, seed=1), ResumableSampler(data, seed=1)
    assert isinstance(a, DistributedSampler)  # so Lightning keeps it under DDP
    a.set_epoch(3)
    b.set_epoch(3)
    order = list(a)
    assert order == list(a) == list(b) and sorted(order) == data and order != data
    b.set_epoch(4)
    assert list(b) != order
    other_seed = ResumableSampler(data, seed=2)
    other_seed.set_epoch(3)
    assert list(other_seed) != order


@pytest.mark.parametrize("n, world", [(103, 2), (100, 4), (7, 3), (50, 1)])
def test_each_rank_draws_what_torchs_distributed_sampler_draws(n, world):
    """The order (padding included) of Lightning's own DistributedSampler for the same seed and epoch, so
    runs on many processes train on the batches they trained on before the sampler was ours."""
    data = list(range(n))
    for epoch in (0, 2):
        for rank in range(world):
            ours = ResumableSampler(data, seed=5, num_replicas=world, rank=rank)
            torchs = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
            ours.set_epoch(epoch)
            torchs.set_epoch(epoch)
            assert list(ours) == list(torchs) and len(ours) == len(torchs)


def test_train_loader_uses_the_lightning_global_seed(cache, monkeypatch):
    dm = make(cache, source="digits")
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableLoader)
    assert isinstance(loader.sampler, ResumableSampler) and loader.sampler.seed == 7


def _batches(loader) -> list[list[int]]:
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 0), (1, 2)])
def test_a_loader_resumed_from_its_state_serves_the_rest_of_the_epoch(world, workers):
    """The state after k batches, loaded into a new loader (a restarted process), makes the next
    iteration of that epoch serve batches k, k+1, ... of the uninterrupted one, on every rank;
    the next epoch is whole again. ``iter`` before ``set_epoch`` (as Lightning does) changes nothing."""
    data = torch.arange(90)

    def loader(rank: int) -> ResumableLoader:
        sampler = ResumableSampler(data, seed=3, num_replicas=world, rank=rank)
        return ResumableLoader(data, batch_size=8, sampler=sampler, drop_last=True, num_workers=workers,
                               persistent_workers=workers > 0)  # fmt: skip

    for rank in range(world):
        straight = loader(rank)
        epochs = []
        for epoch in (0, 1, 2):
            straight.sampler.set_epoch(epoch)
            epochs.append(_batches(straight))
        first = loader(rank)
        first.sampler.set_epoch(1)
        served = iter(first)
        for _ in range(3):
            next(served)
        state = first.state_dict()
        assert state == {"epoch": 1, "samples": 3 * 8 * world}

        resumed = loader(rank)
        resumed.load_state_dict(state)
        batches = iter(resumed)  # created before the epoch is set, as Lightning does
        resumed.sampler.set_epoch(1)
        assert [b.tolist() for b in batches] == epochs[1][3:]
        assert resumed.state_dict() == {"epoch": 1, "samples": len(epochs[1]) * 8 * world}
        resumed.sampler.set_epoch(2)
        assert _batches(resumed) == epochs[2]


def test_a_position_saved_by_two_processes_resumes_on_one():
    """Positions count global samples: two ranks' state after k steps resumes one process at step k."""
    data = list(range(64))
    order = list(ResumableSampler(data, seed=1))
    global_batches = [sorted(order[k:k + 8]) for k in range(0, 64, 8)]
    two = ResumableLoader(data, batch_size=4, sampler=ResumableSampler(data, seed=1, num_replicas=2, rank=0))
    served = iter(two)
    next(served), next(served)
    resumed = ResumableLoader(data, batch_size=8, sampler=ResumableSampler(data, seed=1))
    resumed.load_state_dict(two.state_dict())
    assert [sorted(b.tolist()) for b in resumed] == global_batches[2:]


def test_a_state_of_another_epoch_is_ignored():
    data = list(range(40))
    loader = ResumableLoader(data, batch_size=8, sampler=ResumableSampler(data, seed=0))
    loader.sampler.set_epoch(4)
    whole = _batches(loader)
    loader.load_state_dict({"epoch": 3, "samples": 16})  # an epoch that ended: the next is whole
    assert _batches(loader) == whole


def test_a_loader_needs_the_resumable_sampler():
    with pytest.raises(TypeError, match="ResumableSampler"):
        ResumableLoader(list(range(8)), batch_size=2, shuffle=True)


def test_lightning_sets_the_epoch_so_a_resumed_run_sees_the_same_order(cache, monkeypatch):
    """The order Lightning feeds each epoch is the sampler's (seed, epoch) permutation, nothing else."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 10)
            self.seen: dict[int, list[torch.Tensor]] = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).append(x.clone())
            return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored after the test; seed_everything overwrites it
    L.seed_everything(3, verbose=False)
    dm = ImageDataModule(cache_dir=cache, source="digits", train_samples=40, batch_size=8)
    model = Recorder()
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    for epoch in (0, 1):
        sampler = ResumableSampler(dm.train_dataset, seed=3)
        sampler.set_epoch(epoch)
        order = sampler.permutation()
        expected = torch.stack([dm.train_dataset[i][0] for i in order])
        assert torch.equal(torch.cat(model.seen[epoch]), expected)
    assert not torch.equal(torch.cat(model.seen[0]), torch.cat(model.seen[1]))


def test_one_process_sees_the_global_batches_of_many():
    """Step k of a one-process run holds exactly the samples the W ranks of a DDP run hold at
    step k (the union of their per-rank batches), for every epoch: same seed, same data."""
    data, world, global_batch = list(range(103)), 2, 8
    for epoch in range(3):
        single = ResumableSampler(data, seed=5)
        single.set_epoch(epoch)
        order = single.permutation()
        ranks = []
        for rank in range(world):
            dist = ResumableSampler(data, num_replicas=world, rank=rank, seed=5)
            dist.set_epoch(epoch)
            ranks.append(list(dist))
        per_rank = global_batch // world
        for k in range(len(data) // global_batch):
            union = set().union(*(r[k * per_rank:(k + 1) * per_rank] for r in ranks))
            assert union == set(order[k * global_batch:(k + 1) * global_batch])
