"""What a checkpoint fixes: a resume, ``test`` or ``validate`` cannot silently run another model.

A checkpoint holds its model's hyper-parameters (``hyper_parameters``: the module's class and
init arguments, the net's class and init arguments inside). Lightning's rule is that they win over
the config, which would quietly train a 64-wide ViT when the user asked for 32, or test a ViT when
the config names a ResNet. Here the model the config describes is compared with the checkpoint's
before any work; every key that differs is named with both values and the command is refused.

What may differ:

- always: ``RUNTIME_HPARAMS`` (how the module runs or evaluates, not what the net computes:
  ``compile``, ``compile_mode``, ``channels_last``, ``eval_flip``, ``eval_translate``);
- for ``test``, ``validate`` and ``predict``: also ``TRAINING_HPARAMS`` (the optimiser and its
  schedule, which do not act in evaluation);
- everything outside ``model``: the trainer (epochs, step and batch limits, devices, precision,
  loggers, callbacks), ``run.*`` and ``data.*``.

A key that only one side has (a checkpoint written before an argument existed) is not compared.
"""

from __future__ import annotations

from typing import Any

#: module hyper-parameters that say how the module runs, not what it computes
RUNTIME_HPARAMS = frozenset({"compile", "compile_mode", "channels_last", "eval_flip", "eval_translate"})
#: module hyper-parameters that act only in training (optimiser, schedule, lr scaling)
TRAINING_HPARAMS = frozenset({"lr", "weight_decay", "betas", "warmup_steps", "warmup_fraction", "min_lr_ratio",
                              "lr_scaling", "base_batch_size", "optimizer", "schedule"})
#: subcommands that only evaluate
EVALUATING = frozenset({"test", "validate", "predict"})


def _plain(value: Any) -> Any:
    """Config values as plain data: namespaces as dicts, tuples as lists."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _as_class_tree(hparams: dict) -> dict:
    """A checkpoint's ``hyper_parameters`` in the config's shape: ``{class_path, init_args}``."""
    hparams = {k: v for k, v in hparams.items() if k != "_instantiator"}
    class_path = hparams.pop("_class_path", None)
    return {"class_path": class_path, "init_args": hparams}


def _flatten(tree: Any, prefix: str) -> dict[str, Any]:
    """``{"model.init_args.net.class_path": ..., "model.init_args.net.init_args.embed_dim": 64, ...}``;
    below a class whose path differs nothing is compared (its arguments belong to another class)."""
    if isinstance(tree, dict) and "class_path" in tree:
        out = {f"{prefix}.class_path": tree.get("class_path")}
        for key, value in (tree.get("init_args") or {}).items():
            out.update(_flatten(value, f"{prefix}.init_args.{key}"))
        return out
    return {prefix: tree}


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _given_model(config_model: Any) -> dict | None:
    """The config's ``model`` as plain ``{class_path, init_args}``, or None when it names no class."""
    given = _plain(config_model)
    return given if isinstance(given, dict) and given.get("class_path") else None


def runtime_settings(config_model: Any) -> dict[str, Any]:
    """The config's own values of the module's ``RUNTIME_HPARAMS``: a run from a checkpoint runs
    and evaluates as its config says (compiled or not, channels_last, test-time augmentation),
    not as the checkpoint's run did. Empty when the config gives no model."""
    given = _given_model(config_model)
    return {k: v for k, v in (given.get("init_args") or {}).items() if k in RUNTIME_HPARAMS} if given else {}


def model_differences(config_model: Any, checkpoint_hparams: dict, subcommand: str) -> list[tuple[str, Any, Any]]:
    """``(key, config value, checkpoint value)`` for every model setting the config gives differently.

    ``config_model`` is the config's ``model`` entry (``{class_path, init_args}``, a jsonargparse
    namespace or dict); an empty one (no ``--config`` model) differs from nothing.
    """
    given = _given_model(config_model)
    if not given:
        return []
    ours = _flatten(given, "model")
    theirs = _flatten(_as_class_tree(dict(checkpoint_hparams)), "model")
    free = RUNTIME_HPARAMS | (TRAINING_HPARAMS if subcommand in EVALUATING else frozenset())
    differences = []
    for key in sorted(set(ours) & set(theirs)):
        if key.rpartition(".")[2] in free and key.count(".init_args.") == 1:  # a module argument, not the net's
            continue
        if not _same(ours[key], theirs[key]):
            differences.append((key, ours[key], theirs[key]))
    # a differing class makes its arguments incomparable: name the class only
    classes = [k for k, _, _ in differences if k.endswith("class_path")]
    for cls in classes:
        below = cls[: -len("class_path")]
        differences = [d for d in differences if d[0] == cls or not d[0].startswith(below)]
    return differences


def refusal(differences: list[tuple[str, Any, Any]], ckpt_path: Any, subcommand: str) -> str:
    """The one-line message for a config whose model differs from the checkpoint's."""
    shown = "; ".join(f"--{key} is {_short(ours)} here but {_short(theirs)} in the checkpoint"
                      for key, ours, theirs in differences)
    fix = ("resume with the settings the run was trained with (drop these, or use its config.yaml), or start a "
           "new run (another --run.variant, or --run.overwrite true) to train this model"
           if subcommand == "fit" else
           f"{subcommand} with the config the checkpoint was trained with (its run directory's config.yaml), or "
           "give a checkpoint of this model")
    return f"--ckpt_path {ckpt_path} holds another model than this config: {shown}; {fix}"
