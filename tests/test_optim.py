"""``SGDAdamW``: each group follows PyTorch's own SGD or AdamW step for step, and its state
saves and restores like any optimiser's."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_modules.optim import SGDAdamW


def _net(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _steps(net, optimizers, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(8, 6, generator=g)
        for o in optimizers:
            o.zero_grad()
        net(x).pow(2).mean().backward()
        for o in optimizers:
            o.step()


SGD = dict(lr=0.1, momentum=0.85, nesterov=True, weight_decay=1e-2)
ADAMW = dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.05, eps=1e-8)


@pytest.mark.parametrize(
    "rule,kwargs,reference",
    [
        ("sgd", SGD, lambda p: torch.optim.SGD(p, **SGD)),
        ("sgd", {**SGD, "nesterov": False}, lambda p: torch.optim.SGD(p, **{**SGD, "nesterov": False})),
        ("adamw", ADAMW, lambda p: torch.optim.AdamW(p, **ADAMW)),
    ],
)
def test_each_rule_is_pytorch_s_optimiser(rule, kwargs, reference):
    ours, theirs = _net(), _net()
    _steps(ours, [SGDAdamW([dict(params=ours.parameters(), rule=rule, **kwargs)])], 6)
    _steps(theirs, [reference(theirs.parameters())], 6)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_mixed_groups_update_as_two_optimisers():
    """First layer by SGD, second by AdamW (the defaults' rule): the same as one torch.optim.SGD on
    the first and one torch.optim.AdamW on the second, stepped together."""
    ours, theirs = _net(), _net()
    _steps(ours, [SGDAdamW([dict(params=ours[0].parameters(), rule="sgd", **SGD), dict(params=ours[2].parameters())],
                           **ADAMW)], 5)  # fmt: skip
    _steps(theirs, [torch.optim.SGD(theirs[0].parameters(), **SGD), torch.optim.AdamW(theirs[2].parameters(), **ADAMW)], 5)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_state_dict_round_trip_continues_the_same_run():
    """Stop after 3 steps, restore the net and the optimiser into new objects, step 3 more: the
    same parameters as 6 uninterrupted steps (momentum buffers, Adam moments and step counts all
    travel)."""

    def make(net):
        return SGDAdamW([dict(params=net[0].parameters(), rule="sgd", **SGD), dict(params=net[2].parameters())], **ADAMW)

    straight = _net()
    _steps(straight, [make(straight)], 6)
    first = _net()
    opt = make(first)
    _steps(first, [opt], 3)
    saved_net, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt.state_dict())
    resumed = _net(seed=5)
    resumed.load_state_dict(saved_net)
    opt2 = make(resumed)
    opt2.load_state_dict(saved_opt)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # the same data stream as the straight run's first 3 steps, skipped
        torch.randn(8, 6, generator=g)
    for _ in range(3):
        x = torch.randn(8, 6, generator=g)
        opt2.zero_grad()
        resumed(x).pow(2).mean().backward()
        opt2.step()
    for a, b in zip(resumed.parameters(), straight.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_scheduler_scales_each_group_s_own_rate():
    net = _net()
    opt = SGDAdamW([dict(params=net[0].parameters(), rule="sgd", lr=0.2), dict(params=net[2].parameters())], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 5e-4]
    assert sched.get_last_lr() == [0.1, 5e-4]


@pytest.mark.parametrize(
    "groups,kwargs,match",
    [
        ([{"rule": "lion"}], {}, r"rule='lion' is not one of \['adamw', 'sgd'\]"),
        ([{}], {"rule": "rmsprop"}, r"rule='rmsprop' is not one of"),
        ([{"rule": "sgd", "momentum": 0.0}], {}, r"nesterov=True needs momentum > 0"),
        ([{}], {"momentum": 1.0}, r"momentum=1.0 must be in \[0, 1\)"),
    ],
)
def test_bad_settings_fail_with_the_value(groups, kwargs, match):
    net = _net()
    with pytest.raises(ValueError, match=match):
        SGDAdamW([dict(params=net.parameters(), **g) for g in groups], **kwargs)
