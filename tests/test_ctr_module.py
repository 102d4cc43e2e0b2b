"""lightning_modules/ctr.py and lightning_modules/metrics.py: GAUC, RelaImpr, size checks, training."""

from __future__ import annotations

import copy
import math
import os
import socket

import lightning as L
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sklearn.metrics import roc_auc_score

from datamodules.behavior import BehaviorDataModule
from lightning_modules.base import warmup_schedule
from lightning_modules.ctr import CTRModule, check_feature_sizes, fusable
from lightning_modules.metrics import rela_impr
from lightning_modules.metrics import GroupAUROC
from utils.ranking import group_auroc
from models.ctr import BST, WDL
from tests.behavior_files import ml_latest_small
from tests.helpers import brute_force_gauc

COUNTS = ("impressions", "users", "gauc_impressions", "gauc_users")


# ------------------------------------------------------------------------------------- GAUC

def brute_force_coverage(target: np.ndarray, groups: np.ndarray) -> dict[str, int]:
    """Impressions and users, and those of the users with both labels, counted user by user."""
    both = [g for g in np.unique(groups) if len(np.unique(target[groups == g])) == 2]
    return {"impressions": len(target), "users": len(np.unique(groups)),
            "gauc_impressions": int(sum((groups == g).sum() for g in both)), "gauc_users": len(both)}


def random_impressions(n: int, n_groups: int, seed: int):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, n) * 7 + 3  # sparse, non-contiguous ids
    target = rng.integers(0, 2, n)
    preds = np.round(rng.random(n) * 6) / 6  # few distinct values: many ties, within and across labels
    preds = np.where(target == 1, np.minimum(preds + 0.1, 1.0), preds)
    allpos = groups == groups[0]  # one user with only positives, one with only negatives
    target[allpos] = 1
    target[groups == groups[1]] = 0 if groups[1] != groups[0] else 1
    return preds.astype(np.float32), target, groups


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gauc_equals_brute_force_per_user_sklearn(seed):
    preds, target, groups = random_impressions(2000, 60, seed)
    expected = brute_force_gauc(target, preds, groups)
    got = group_auroc(torch.from_numpy(preds), torch.from_numpy(target), torch.from_numpy(groups))
    assert math.isclose(float(got), expected, rel_tol=0, abs_tol=1e-9)
    metric = GroupAUROC()
    for chunk in np.array_split(np.arange(len(preds)), 7):
        metric.update(torch.from_numpy(preds[chunk]), torch.from_numpy(target[chunk]), torch.from_numpy(groups[chunk]))
    assert math.isclose(float(metric.compute()), expected, abs_tol=1e-6)


def test_gauc_per_group_values_and_weighting():
    preds = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.2, 0.3, 0.4, 0.7, 0.7])
    target = torch.tensor([0, 1, 0, 1, 1, 1, 0, 1, 0])
    groups = torch.tensor([5, 5, 2, 2, 9, 9, 1, 1, 1])
    gauc, ids, auc, counts, valid = group_auroc(preds, target, groups, return_per_group=True)
    assert ids.tolist() == [1, 2, 5, 9]
    assert counts.tolist() == [3, 2, 2, 2]
    assert valid.tolist() == [True, True, True, False]
    # group 1: positive 0.7 vs negatives 0.4 (win) and 0.7 (tie): (1 + 0.5) / 2
    torch.testing.assert_close(auc[:3], torch.tensor([0.75, 0.5, 1.0], dtype=torch.float64))
    assert math.isnan(auc[3])
    assert math.isclose(float(gauc), (3 * 0.75 + 2 * 0.5 + 2 * 1.0) / 7)


def test_gauc_is_nan_with_a_warning_when_no_user_has_both_labels():
    metric = GroupAUROC()
    metric.update(torch.tensor([0.2, 0.4]), torch.tensor([1, 1]), torch.tensor([1, 2]))
    with pytest.warns(UserWarning, match="no group has both labels"):
        assert math.isnan(float(metric.compute()))
    with pytest.raises(ValueError, match="same length"):
        metric.update(torch.tensor([0.2]), torch.tensor([1, 0]), torch.tensor([1, 2]))


def test_gauc_coverage_counts_the_users_with_both_labels():
    preds, target, groups = random_impressions(2000, 60, 5)
    expected = brute_force_coverage(target, groups)
    assert 0 < expected["gauc_users"] < expected["users"]  # one-class users exist, and are not counted
    metric = GroupAUROC()
    for chunk in np.array_split(np.arange(len(preds)), 5):
        metric.update(torch.from_numpy(preds[chunk]), torch.from_numpy(target[chunk]), torch.from_numpy(groups[chunk]))
    gauc = float(metric.compute())
    assert metric.coverage() == expected and float(metric.compute()) == gauc  # the counts of the value computed
    metric.reset()
    metric.update(torch.tensor([0.2, 0.4, 0.6]), torch.tensor([1, 0, 1]), torch.tensor([4, 4, 9]))
    assert metric.coverage() == {"impressions": 3, "users": 2, "gauc_impressions": 2, "gauc_users": 1}


def test_gauc_merged_states_equal_one_metric_over_everything():
    """Two processes' states (a user's impressions split between them) merge to the global GAUC."""
    preds, target, groups = random_impressions(1500, 40, 3)
    rank0, rank1, single = GroupAUROC(), GroupAUROC(), GroupAUROC()
    perm = np.random.default_rng(0).permutation(len(preds))
    a, b = perm[:600], perm[600:]
    rank0.update(torch.from_numpy(preds[a]), torch.from_numpy(target[a]), torch.from_numpy(groups[a]))
    rank1.update(torch.from_numpy(preds[b]), torch.from_numpy(target[b]), torch.from_numpy(groups[b]))
    single.update(torch.from_numpy(preds), torch.from_numpy(target), torch.from_numpy(groups))
    separate_mean = (float(copy.deepcopy(rank0).compute()) + float(copy.deepcopy(rank1).compute())) / 2
    rank0.merge_state(rank1)
    assert math.isclose(float(rank0.compute()), float(single.compute()), abs_tol=1e-7)
    assert rank0.coverage() == single.coverage() == brute_force_coverage(target, groups)
    assert not math.isclose(separate_mean, float(single.compute()), abs_tol=1e-4)  # averaging would be wrong


def _gauc_worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        preds, target, groups = random_impressions(1500, 40, 3)
        part = np.array_split(np.arange(len(preds)), [700])[rank]  # uneven halves
        metric = GroupAUROC()
        metric.update(torch.from_numpy(preds[part]), torch.from_numpy(target[part]), torch.from_numpy(groups[part]))
        queue.put((rank, (float(metric.compute()), metric.coverage())))  # compute() gathers every process's state
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_gauc_synced_over_two_cpu_processes_equals_one_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_gauc_worker, args=(2, port, queue), nprocs=2, start_method="spawn", join=True)
    results = dict(queue.get() for _ in range(2))
    preds, target, groups = random_impressions(1500, 40, 3)
    expected = brute_force_gauc(target, preds, groups)
    for rank in (0, 1):
        gauc, coverage = results[rank]
        assert math.isclose(gauc, expected, abs_tol=1e-6)
        assert coverage == brute_force_coverage(target, groups)  # every impression, not this process's share


# ------------------------------------------------------------------------------------- helpers
def test_rela_impr():
    """((AUC - 0.5) / (AUC_base - 0.5) - 1) x 100 (DIN, BST); undefined for a baseline at chance."""
    assert math.isclose(rela_impr(0.7894, 0.7734), (0.2894 / 0.2734 - 1) * 100)
    assert rela_impr(0.61, 0.72) == pytest.approx(-50.0)
    assert rela_impr(0.7734, 0.7734) == 0.0
    with pytest.raises(ValueError, match="auc_base=0.5"):
        rela_impr(0.6, 0.5)


def test_check_feature_sizes():
    data = {"n_users": 11, "n_items": 21, "n_categories": 5, "profile_sizes": [3, 7], "n_position_buckets": 24, "seq_len": 20}
    check_feature_sizes({"n_items": 21, "n_categories": 9, "profile_sizes": [3, 8]}, data)  # bigger is fine
    with pytest.raises(ValueError, match=r"n_items=20 but the data needs n_items >= 21"):
        check_feature_sizes({"n_items": 20, "n_categories": 5}, data)
    with pytest.raises(ValueError, match=r"profile_sizes has 1 fields but the data has 2"):
        check_feature_sizes({"n_items": 21, "n_categories": 5, "profile_sizes": [3]}, data)
    with pytest.raises(ValueError, match=r"seq_len=10 but the data needs seq_len >= 20"):
        check_feature_sizes({"n_items": 21, "n_categories": 5, "seq_len": 10}, data)


def test_warmup_schedule():
    kw = dict(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [warmup_schedule(s, schedule="constant", **kw) for s in (0, 3, 4, 100)] == [0.25, 1.0, 1.0, 1.0]
    assert math.isclose(warmup_schedule(4, schedule="cosine", **kw), 1.0)
    assert math.isclose(warmup_schedule(14, schedule="cosine", **kw), 0.1)


def test_invalid_module_config_fails_up_front():
    net = WDL(n_items=5, n_categories=3, mlp_dims=(4,))
    with pytest.raises(ValueError, match=r"optimizer='sgd' is not one of \['adamw', 'adam'\]"):
        CTRModule(net, optimizer="sgd")
    with pytest.raises(ValueError, match="lr=0"):
        CTRModule(net, lr=0)


def test_weight_decay_spares_embeddings_norms_and_biases():
    net = BST(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4, num_heads=2, mlp_dims=(8,))
    module = CTRModule(net, weight_decay=0.1)
    decay, no_decay = module.parameter_groups()
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    decayed = {id(p) for p in decay["params"]}
    for name, p in net.named_parameters():
        is_linear_weight = name.endswith("weight") and p.ndim == 2 and "embedding" not in name and "features" not in name
        assert (id(p) in decayed) == is_linear_weight, name
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(net.parameters()))


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_optimizer_is_fused_on_a_cpu_and_updates_as_the_plain_one(optimizer):
    """The fused kernel where the parameters allow it: the same update as the per-tensor loop."""
    torch.manual_seed(0)
    net = BST(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4, num_heads=2, mlp_dims=(8,))
    plain_net = copy.deepcopy(net)
    fused = CTRModule(net, optimizer=optimizer, weight_decay=0.1).configure_optimizers()
    module = CTRModule(plain_net, optimizer=optimizer, weight_decay=0.1)
    plain = type(fused)([{k: g[k] for k in ("params", "weight_decay")} for g in module.parameter_groups()],
                        lr=module.hparams.lr, foreach=False)
    assert all(g["fused"] for g in fused.param_groups) and not plain.param_groups[0]["fused"]
    for step in range(3):
        for a, b in zip(net.parameters(), plain_net.parameters()):
            a.grad = torch.full_like(a, 0.1 * (step + 1)).sin() + a.detach()
            b.grad = a.grad.clone()
        fused.step(), plain.step()
    for a, b in zip(net.parameters(), plain_net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not fusable([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)),
                        torch.nn.Parameter(torch.zeros(2, device="meta"))])


# ------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    dm = BehaviorDataModule(cache_dir=str(tmp_path_factory.mktemp("ctr-cache")), synthetic_samples=6000,
                            synthetic_users=200, synthetic_items=120, synthetic_categories=10, seq_len=8,
                            batch_size=128, seed=0)
    dm.prepare_data()
    return dm


def tiny_bst_for(dm: BehaviorDataModule, **kw) -> BST:
    sizes = dm.feature_sizes
    args = dict(n_items=sizes["n_items"], n_categories=sizes["n_categories"], n_users=sizes["n_users"],
                profile_sizes=sizes["profile_sizes"], n_position_buckets=sizes["n_position_buckets"],
                seq_len=sizes["seq_len"], item_dim=8, category_dim=8, position_dim=8, user_dim=4,
                profile_dim=4, num_heads=2, mlp_dims=(32, 16), dropout=0.0)
    args.update(kw)
    return BST(**args)


def trainer(**kw) -> L.Trainer:
    args = dict(max_epochs=1, logger=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    args.update(kw)
    return L.Trainer(**args)


def test_training_a_tiny_bst_reduces_the_loss_and_logs_auc_and_gauc(synthetic):
    L.seed_everything(0)
    module = CTRModule(tiny_bst_for(synthetic), lr=1e-2)
    seen = synthetic.example_batch(1024)  # training samples

    def loss_on_seen() -> float:
        module.eval()
        with torch.no_grad():
            loss = float(torch.nn.functional.binary_cross_entropy_with_logits(module(seen), seen["label"]))
        module.train()
        return loss

    train_before = loss_on_seen()
    before = trainer().validate(module, datamodule=synthetic, verbose=False)[0]
    assert set(before) == {"val/auc", "val/gauc", "val/logloss", *(f"val/{c}" for c in COUNTS)}
    fit = trainer(max_epochs=3, limit_train_batches=30)
    fit.fit(module, datamodule=synthetic)
    logged = fit.callback_metrics
    for key in ("train/loss", "val/auc", "val/gauc", "val/logloss"):
        assert key in logged and torch.isfinite(logged[key]), key
    assert loss_on_seen() < train_before - 0.02
    after = trainer().validate(module, datamodule=synthetic, verbose=False)[0]
    assert after["val/logloss"] < before["val/logloss"]
    assert after["val/auc"] > 0.55
    test = trainer().test(module, datamodule=synthetic, verbose=False)[0]
    assert set(test) == {"test/auc", "test/gauc", "test/logloss", *(f"test/{c}" for c in COUNTS)}
    # the logged AUC is the AUC of the predictions over the whole split
    preds = trainer().predict(module, datamodule=synthetic)
    probs = torch.cat([p["prob"] for p in preds]).numpy()
    labels = torch.cat([p["label"] for p in preds]).numpy()
    assert ((probs > 0) & (probs < 1)).all()
    assert math.isclose(test["test/auc"], roc_auc_score(labels, probs), abs_tol=1e-4)
    assert module.flops_per_sample and module.flops_per_sample > 0
    assert module.num_params == sum(p.numel() for p in module.net.parameters())


def test_setup_rejects_a_net_too_small_for_the_data(synthetic):
    sizes = synthetic.feature_sizes
    module = CTRModule(tiny_bst_for(synthetic, n_items=sizes["n_items"] - 1))
    with pytest.raises(ValueError, match=rf"n_items={sizes['n_items'] - 1} but the data needs n_items >= {sizes['n_items']}"):
        trainer(max_steps=1).fit(module, datamodule=synthetic)


def test_gauc_and_its_coverage_on_a_real_movielens_slice_equal_a_brute_force_count(tmp_path):
    """The first 60 users of ml-latest-small on the default per-user split: the logged GAUC is the
    per-user sklearn AUC weighted by impressions, and the counts are those of the users with both labels."""
    folder = ml_latest_small(tmp_path / "ml-latest-small", n_users=60)
    dm = BehaviorDataModule(source="movielens_csv", data_dir=str(folder), cache_dir=str(tmp_path / "c"), seq_len=8,
                            batch_size=128, eval_batch_size=100)
    dm.prepare_data()
    assert dm.describe()["splits"]["test"]["users"] == 60  # every user of ml-latest-small has 20 ratings or more
    L.seed_everything(0)
    module = CTRModule(tiny_bst_for(dm))
    logged = {}
    for stage, run in (("val", trainer().validate), ("test", trainer().test)):
        logged.update(run(module, datamodule=dm, verbose=False)[0])
    preds = trainer().predict(module, datamodule=dm)  # the test split, in order
    probs = torch.cat([p["prob"] for p in preds]).numpy()
    labels = torch.cat([p["label"] for p in preds]).numpy().astype(int)
    users = torch.cat([p["user"] for p in preds]).numpy()
    assert len(labels) > 2 * 100  # several evaluation batches, so the metric accumulates
    expected = brute_force_coverage(labels, users)
    assert 0 < expected["gauc_users"] < 60  # some test users liked (or disliked) every test movie
    assert math.isclose(logged["test/gauc"], brute_force_gauc(labels, probs, users), abs_tol=1e-6)
    assert {c: logged[f"test/{c}"] for c in COUNTS} == expected
    val = dm.split_dataset("val").with_format("numpy")[:]
    assert {c: logged[f"val/{c}"] for c in COUNTS} == brute_force_coverage(val["label"].astype(int), val["user"])
