"""Training order: a function of (Lightning global seed, epoch) only (``datamodules/images/sampler.py``)."""

from __future__ import annotations

import torch
from torch.utils.data import RandomSampler

from datamodules.images import ImageDataModule, SeededRandomSampler
from tests.images_helpers import cache, isolated, make  # noqa: F401


def test_sampler_order_depends_only_on_seed_and_epoch():
    data = list(range(50))
    a, b = SeededRandomSampler(data, seed=1), SeededRandomSampler(data, seed=1)
    assert isinstance(a, RandomSampler)  # so Lightning treats the loader as shuffled
    a.set_epoch(3)
    b.set_epoch(3)
    order = list(a)
    assert order == list(a) == list(b) and sorted(order) == data and order != data
    b.set_epoch(4)
    assert list(b) != order
    other_seed = SeededRandomSampler(data, seed=2)
    other_seed.set_epoch(3)
    assert list(other_seed) != order


def test_train_loader_uses_the_lightning_global_seed(cache, monkeypatch):
    dm = make(cache, source="digits")
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    sampler = dm.train_dataloader().sampler
    assert isinstance(sampler, SeededRandomSampler) and sampler.seed == 7


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
        sampler = SeededRandomSampler(dm.train_dataset, seed=3)
        sampler.set_epoch(epoch)
        order = sampler.permutation()
        expected = torch.stack([dm.train_dataset[i][0] for i in order])
        assert torch.equal(torch.cat(model.seen[epoch]), expected)
    assert not torch.equal(torch.cat(model.seen[0]), torch.cat(model.seen[1]))


def test_one_process_sees_the_global_batches_of_many():
    """Step k of a one-process run holds exactly the samples the W ranks of a DDP run hold at
    step k (the union of their per-rank batches), for every epoch: same seed, same data."""
    from torch.utils.data import DistributedSampler

    data, world, global_batch = list(range(103)), 2, 8
    for epoch in range(3):
        single = SeededRandomSampler(data, seed=5)
        single.set_epoch(epoch)
        order = single.permutation()
        ranks = []
        for rank in range(world):
            dist = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
            dist.set_epoch(epoch)
            ranks.append(list(dist))
        per_rank = global_batch // world
        for k in range(len(data) // global_batch):
            union = set().union(*(r[k * per_rank:(k + 1) * per_rank] for r in ranks))
            assert union == set(order[k * global_batch:(k + 1) * global_batch])

