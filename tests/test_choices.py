"""Closed choices (utils/choices.py): one Literal per set, checked by the CLI and by constructors.

Also that the subclasses forwarding ``**kwargs`` (HybridViT, ConvStemViT, WDLSeq and the two
LightningModules) still show every parent argument to the CLI.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from typing import get_type_hints

import pytest
import yaml

from lightning_modules import base, ctr as ctr_module, image_classifier, optim
from lightning_modules.ctr import CTRModule
from lightning_modules.image_classifier import ImageClassifier
from models import ctr, hybrid, position, resnet, vit
from utils.choices import check_choice, choices
from reproductions.__main__ import main as repro_main
from reproductions.run.cli import ReproductionCLI

DIGITS = "reproductions/vit/configs/digits.yaml"
HYBRID = "reproductions/vit/configs/hybrid_fashion_mnist.yaml"
CONVSTEM = "reproductions/vit/configs/convstem_fashion_mnist.yaml"
RESNET = "reproductions/vit/configs/resnet_fashion_mnist.yaml"
BST_CONFIG = "reproductions/bst/configs/bst.yaml"
WDL_SEQ = "reproductions/bst/configs/wdl_seq.yaml"

#: (tuple kept for tests and docs, its Literal, a constructor and keyword annotated with it)
SETS = [
    (vit.POOLINGS, vit.Pooling, vit.ViT, "pool"),
    (vit.ATTENTIONS, vit.AttentionScoring, vit.ViT, "attention"),
    (position.POS_EMBED_KINDS, position.PosEmbedKind, vit.ViT, "pos_embed"),
    (position.POS_PLACEMENTS, position.PosPlacement, vit.ViT, "pos_placement"),
    (resnet.STEMS, resnet.StemKind, resnet.ResNet, "stem"),
    (resnet.BLOCKS, resnet.BlockKind, hybrid.HybridViT, "block"),
    (resnet.PADDINGS, resnet.Padding, resnet.ResNet, "padding"),
    (resnet.POOLS, resnet.ResNetPool, resnet.ResNet, "pool"),
    (resnet.NORMS, resnet.NormKind, resnet.ResNet, "norm"),
    (hybrid.CONSTRUCTIONS, hybrid.Construction, hybrid.HybridViT, "construction"),
    (hybrid.STEM_DOWNSAMPLES, hybrid.StemDownsample, hybrid.ConvStemViT, "downsample"),
    (hybrid.STEM_BLOCKS, hybrid.StemBlock, hybrid.ConvStemViT, "stem_block"),
    (ctr.POSITIONS, ctr.PositionKind, ctr.BST, "position"),
    (ctr.SEQ_POOLINGS, ctr.SeqPooling, ctr.BST, "seq_pooling"),
    (ctr.WDL_SEQUENCE, ctr.SequencePooling, ctr.WDLSeq, "sequence_pooling"),
    (ctr.DIN_ACTIVATIONS, ctr.DINActivation, ctr.DIN, "activation"),
    (base.LR_SCALINGS, base.LRScaling, base.TrainingModule, "lr_scaling"),
    (base.COMPILE_MODES, base.CompileMode, base.TrainingModule, "compile_mode"),
    (base.SCHEDULES, base.Schedule, CTRModule, "schedule"),
    (ctr_module.OPTIMIZERS, ctr_module.OptimizerName, CTRModule, "optimizer"),
    (image_classifier.STEM_OPTIMIZERS, image_classifier.StemOptimizer, image_classifier.ImageClassifier, "stem_optimizer"),
    (optim.RULES, optim.Rule, optim.SGDAdamW, "rule"),
]


def cli(*args: str) -> tuple[int, str, str]:
    """``python -m reproductions fit ...``: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = repro_main(["fit", *args])
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- one source of truth


@pytest.mark.parametrize("values, literal, cls, keyword", SETS, ids=[f"{s[2].__name__}.{s[3]}" for s in SETS])
def test_each_set_is_one_literal_in_the_signature(values, literal, cls, keyword):
    assert values == choices(literal) and len(set(values)) == len(values)
    assert get_type_hints(cls.__init__)[keyword] == literal
    assert inspect.signature(cls.__init__).parameters[keyword].default in values


def test_nested_literals_flatten_in_order():
    assert position.POS_EMBED_KINDS == ("none", *position.ABSOLUTE_KINDS, *position.RELATIVE_KINDS)


def test_check_choice_names_the_keyword_the_value_and_the_allowed_ones():
    check_choice("pool", "gap", vit.Pooling)
    with pytest.raises(ValueError, match=r"^pool='max' is not one of \['cls', 'gap'\]$"):
        check_choice("pool", "max", vit.Pooling)
    with pytest.raises(TypeError, match="not a typing.Literal"):
        choices(str)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CTRModule(ctr.WDL(n_items=5, n_categories=3, mlp_dims=(4,)), schedule="linear"),
         r"schedule='linear' is not one of \['constant', 'cosine'\]"),
        (lambda: ImageClassifier(vit.ViT(), lr_scaling="cubic"), r"lr_scaling='cubic' is not one of"),
        (lambda: hybrid.HybridViT(pool="max"), r"pool='max' is not one of \['cls', 'gap'\]"),  # via **kwargs
        (lambda: hybrid.ConvStemViT(pos_placement="everywhere"), r"pos_placement='everywhere' is not one of"),
        (lambda: ctr.WDLSeq(n_items=5, n_categories=3, sequence_pooling="max"), r"sequence_pooling='max'"),
        (lambda: position.build_absolute(kind="relative", grid_size=(2, 2), embed_dim=4),
         r"pos_embed='relative' is not one of \['learned_1d', 'learned_2d', 'sincos_2d'\]"),
    ],
)
def test_direct_construction_fails_clearly(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    "config, key, value, allowed",
    [
        (DIGITS, "model.init_args.net.init_args.pool", "max2", "['cls', 'gap']"),
        (HYBRID, "model.init_args.net.init_args.pool", "max2", "['cls', 'gap']"),  # a ViT argument via **kwargs
        (HYBRID, "model.init_args.net.init_args.stem", "tiny", "['imagenet', 'small']"),
        (RESNET, "model.init_args.net.init_args.block", "resnext", "['bottleneck', 'preact_bottleneck', 'preact_basic']"),
        (DIGITS, "model.init_args.lr_scaling", "cubic", "['none', 'linear', 'sqrt']"),  # a TrainingModule argument
        (WDL_SEQ, "model.init_args.schedule", "linear", "['constant', 'cosine']"),
        (BST_CONFIG, "model.init_args.net.init_args.position", "sinusoid", "['time_delta', 'index', 'none']"),
    ],
)
def test_a_bad_choice_is_rejected_while_parsing(monkeypatch, config, key, value, allowed):
    def build(self):
        raise AssertionError("the config parsed: classes are being built")

    monkeypatch.setattr(ReproductionCLI, "instantiate_classes", build)
    code, _, err = cli("--config", config, f"--{key}", value)
    assert code == 2  # a usage error, before anything is built
    assert err.splitlines()[-1] == f"error: --{key}={value} is not allowed; use one of {allowed[1:-1]}"


def test_help_lists_the_choices():
    _, out, _ = cli("--config", HYBRID, "--model.net.help", "models.hybrid.HybridViT")
    assert "--net.stem {imagenet,small}" in out and "--net.construction {last_stage,extend_previous}" in out
    assert "--net.pool {cls,gap}" in out  # ViT's, followed through **kwargs
    assert "{none,learned_1d,learned_2d,sincos_2d,relative,relative_2d}" in out
    _, out, _ = cli("--config", WDL_SEQ, "--model.help", "lightning_modules.ctr.CTRModule")
    for shown in ("--model.schedule {constant,cosine}", "--model.optimizer {adamw,adam}",
                  "--model.lr_scaling {none,linear,sqrt}", "--model.compile_mode {default,reduce-overhead,"):
        assert shown in out, shown


def _init_args(config: str, *overrides: str) -> tuple[dict, dict]:
    """The model's and the net's init_args as ``--print_config`` resolves them."""
    _, out, _ = cli("--config", config, *overrides, "--print_config")
    model = yaml.safe_load(out)["model"]["init_args"]
    return model, model["net"]["init_args"]


def _keywords(cls) -> set[str]:
    return {n for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize(
    "config, module, cls, parent, override",
    [
        (HYBRID, ImageClassifier, hybrid.HybridViT, vit.ViT, ("depth", "1")),
        (CONVSTEM, ImageClassifier, hybrid.ConvStemViT, vit.ViT, ("pos_embed", "sincos_2d")),
        (WDL_SEQ, CTRModule, ctr.WDLSeq, ctr.WDL, ("mlp_dropout", "0.25")),
    ],
)
def test_parent_arguments_forwarded_through_kwargs_are_all_configurable(config, module, cls, parent, override):
    model, net = _init_args(config, f"--model.init_args.net.init_args.{override[0]}", override[1])
    assert set(net) == (_keywords(parent) - {"embed_layer"}) | _keywords(cls)
    assert str(net[override[0]]) == override[1]
    assert set(model) == {"net"} | _keywords(base.TrainingModule) | _keywords(module)
    with pytest.raises(TypeError, match="unexpected keyword argument 'depht'"):
        cls(depht=2)
