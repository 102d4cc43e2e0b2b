"""Whether a rerun measured the same experiment as a reference record: what decides the number,
compared part by part before any verdict.

A user's run of a sweep profile and the registry's record of that profile are compared on:

- **data**: the data's identity as the run's ``data`` description records it (``DATA_IDENTITY``:
  the source, its origin, the counts of the raw files, the samples per split, the image counts
  and classes) and every ``data.*`` key of the resolved config but the batch size. The model's
  vocabulary and input sizes (``DATA_SIZED``: ``n_items``, ``num_classes``...) follow the data:
  they count with it when the data differs, else with the model;
- **model**: every other ``model.*`` key (the net, its sizes, the optimiser and its schedule);
- **budget**: ``BUDGET_KEYS``, the epochs, steps, time and batches a fit may take and the batch size;
- **other settings**: every other key of the resolved config (precision, ``ckpt_path``, callbacks...).

The configs are the registry's computed part (``records.computed_part``: no run names, no
locations such as ``data.data_dir``, so the same data in another folder is the same data), with
paths cut as a record keeps them. Left out too: the seed (``seed_everything``: each run is held
against the record of its own seed where there is one, else against any) and where it ran
(``PLACE_KEYS``: accelerator, devices, nodes, strategy; the report shows the hardware, and its
effect is the noise a verdict measures). A key that only one side has (an option added to the code
or removed since) is not a difference, as in the registry.

Layer: beside ``reference`` (imports records).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproductions.sweeping.records import computed_part, config_differences, flatten, scrub_paths

#: the fields of a run's data description that identify the data (a prefix covers its sub-fields)
DATA_IDENTITY = ("source", "origin", "test_split", "raw", "splits.train.samples", "splits.val.samples",
                 "splits.test.samples", "train_size", "val_size", "test_size", "num_classes")  # fmt: skip
#: resolved-config keys of the training budget
BUDGET_KEYS = ("trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.min_epochs", "trainer.min_steps",
               "trainer.limit_train_batches", "trainer.accumulate_grad_batches", "data.init_args.batch_size")  # fmt: skip
#: resolved-config keys of where a run ran, not what it computed
PLACE_KEYS = ("seed_everything", "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy")
#: the model's sizes that the data sets (the last part of a ``model.*`` key)
DATA_SIZED = ("n_users", "n_items", "n_categories", "profile_sizes", "num_classes", "img_size", "in_chans")
PARTS = ("data", "model", "budget", "other settings")
#: differences named per part in the text (the rest are counted)
SHOWN = 3


@dataclass(frozen=True)
class Difference:
    part: str  # one of PARTS
    what: str  # a config key without its ``init_args`` levels, or a data field ("source", "ratings", "train samples")
    yours: Any
    reference: Any


def data_identity(description: dict | None) -> dict[str, Any]:
    """The identity fields of a run's data description (``DATA_IDENTITY``), flat, paths cut."""
    flat = flatten(scrub_paths(description or {}))
    rank = {k: next((i for i, f in enumerate(DATA_IDENTITY) if k == f or k.startswith(f + ".")), None) for k in flat}
    return {k: flat[k] for k in sorted((k for k in flat if rank[k] is not None), key=lambda k: rank[k])}


def _field_name(key: str) -> str:
    if key.startswith("raw."):
        return key.removeprefix("raw.")
    if key.startswith("splits."):
        return key.split(".")[1] + " samples"
    return key


def _key_name(key: str) -> str:
    """``model.init_args.net.init_args.num_blocks`` -> ``model.net.num_blocks``; a data key by its
    option name alone (``data.init_args.source`` -> ``source``, as the data's description names it)."""
    name = ".".join(p for p in key.split(".") if p != "init_args")
    return name.removeprefix("data.") if _part(key) == "data" else name


def _part(key: str) -> str:
    if key in BUDGET_KEYS:
        return "budget"
    top = key.split(".", 1)[0]
    return top if top in ("data", "model") else "other settings"


def differences(yours: dict, your_config: dict | None, reference: dict) -> list[Difference]:
    """What decides the number that differs between a run and a reference record (see the module
    docstring): ``yours``, the run's results (``data``); ``your_config``, its resolved config
    (nested as ``config.yaml``, or a record's flat ``config``; None: unknown, not compared);
    ``reference``, the record's results (its flat ``config`` and ``data``)."""
    out: list[Difference] = []
    mine, theirs = data_identity(yours.get("data")), data_identity(reference.get("data"))
    for key in [k for k in theirs if k in mine and mine[k] != theirs[k]]:
        out.append(Difference("data", _field_name(key), mine[key], theirs[key]))
    if your_config is not None and isinstance(reference.get("config"), dict):
        flat = scrub_paths(computed_part(your_config))
        for key, d in config_differences(flat, reference["config"], flat=True).items():
            if key not in PLACE_KEYS:
                out.append(Difference(_part(key), _key_name(key), d["run"], d["definition"]))
    data_differs = any(d.part == "data" for d in out)
    return [Difference("data", d.what, d.yours, d.reference)
            if d.part == "model" and data_differs and d.what.rsplit(".", 1)[-1] in DATA_SIZED else d for d in out]


def _value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int):
        return f"{v:,}"
    return v if isinstance(v, str) else json.dumps(v)


def _data_label(description: dict | None) -> str:
    """``source (folder)``: the source and the name of its data folder, where the run read one."""
    d = description or {}
    folder = Path(str(d["data_dir"])).name if d.get("data_dir") else ""
    source = str(d.get("source") or "")
    return f"{source} ({folder})" if folder and folder != source else source


def _shown(d: Difference, yours: dict, reference: dict) -> str:
    if d.part == "data" and d.what == "source":
        return f"{_data_label(yours.get('data')) or _value(d.yours)} vs {_data_label(reference.get('data')) or _value(d.reference)}"
    return f"{d.what} {_value(d.yours)} vs {_value(d.reference)}"


def describe(diffs: list[Difference], yours: dict | None = None, reference: dict | None = None) -> str:
    """``data differs (movielens_1m (ml-1m) vs movielens_csv (ml-latest-small); ratings 12,000 vs 100,836);
    model same; budget same`` (other settings named only where they differ); yours first.
    ``yours``/``reference``: the two results, for the data folder names beside a source."""
    parts = []
    for part in PARTS:
        first: dict[str, Difference] = {}
        for d in diffs:
            if d.part == part:
                first.setdefault(d.what, d)  # one per key: the first run's
        mine = list(first.values())
        if not mine:
            if part != "other settings":
                parts.append(f"{part} same")
            continue
        shown = "; ".join(_shown(d, yours or {}, reference or {}) for d in mine[:SHOWN])
        more = f"; and {len(mine) - SHOWN} more" if len(mine) > SHOWN else ""
        parts.append(f"{part} {'differ' if part.endswith('s') else 'differs'} ({shown}{more})")
    return "; ".join(parts)
