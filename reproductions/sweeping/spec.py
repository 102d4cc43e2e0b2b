"""Sweep files: an ablation grid of one experiment, read and checked (the lowest layer).

A sweep file (``reproductions/<paper>/sweeps/<name>.yaml``, named ``<paper>/<name>`` on the
command line, or any path to a YAML file) holds:

    title: Position embeddings (ViT Appendix D.4, Table 8)
    axis: position              # the ablation axis: a W&B tag, the report's subject
    base: reproductions/vit/configs/digits.yaml   # the experiment (repo-relative path)
    seeds: 3                    # a count (seeds 0..n-1) or a list of seeds
    aliases:                    # short names for override keys (optional)
      pos_embed: model.net.init_args.pos_embed
    overrides: {}               # applied to every run of every profile (optional)
    variants:                   # an explicit list ...
      - name: learned_2d-every_layer
        overrides: {pos_embed: learned_2d, pos_placement: every_layer}
        paper: {table8: 0.64046}          # optional: value per reference column
      - name: WDL                         # optional: the variant's own experiment config
        base: reproductions/bst/configs/wdl.yaml   # (one model per config; wins over base)
    product:                    # ... or a cartesian product of axes
      pool: [cls, gap]                    # -> variants "pool=cls,lr=0.001", ...
      lr: [3.0e-4, 1.0e-3]
        # or a list of such grids over the same axes, their points in turn (a wider grid where one
        # part of the sweep needs it: [{size: [1000], lr: [...4 values]}, {size: [54000], lr: [...2]}]);
        # a point in two grids is an error (its name repeats)
        # both: every variant crossed with every product point ("ViT,train_samples=1000");
        # a variant's ``axes: {model: ViT, size: S}`` names it on the report's axes
    references:                 # the report's paper columns (optional)
      table8: {label: "...", scale: fraction, note: "...", unverified: false}
    metric: {key: test/acc, label: "test acc. (%)", scale: 100}   # the report's main column
        # (key: a test metric ``stage/name``, or a dotted results.json path such as best.score,
        # the best checkpoint's monitored validation value, which a tuning sweep ranks by, or
        # final.val/acc, the last validation value)
        # (optional; also digits: 2, unit: points (how differences are named), ceiling: a
        # results.json path such as data.ceiling.test_auc: the best reachable value, a table row)
    columns: [{key: test/gauc, label: GAUC, scale: 1, digits: 4}]  # more metric columns (optional)
    claims: ["..."]             # the paper's claims, printed in the report (optional)
    report: {plot: bars, ...}   # how the report draws and checks (sweeping/figures.py, checks.py)
    profiles:
      smoke: {seeds: 1, overrides: {...}}             # seconds, for tests
      cpu:   {seeds: 3, jobs: 2, overrides: {...}}    # minutes on 2 CPU cores, no network
      gpu:   {base: .../cifar10.yaml, overrides: {...}, product: {...}}

Every profile names its scale (``repro claims`` orders the profiles by it and draws each claim
against it): ``scale: {axis: tokens, value: 16, data: digits}``; ``axis`` is one of ``SCALE_AXES``
(``tokens``, ``train_images``, ``samples``, and the training budget ``epochs`` or ``train_steps``:
a positive number; ``dataset``: a name), ``data`` the data set (optional), and ``budget`` (optional,
on a scale whose axis is not a budget) the training budget in words (``4 epochs``), so a profile on a
budget axis (``fmnist-long``: 16 epochs) reads beside the one it lengthens.
A profile adds overrides to every run, may add ``configs`` (overlay YAML files given after each
run's base config and before the overrides, e.g. a data source: ``reproductions/bst/sources/*.yaml``)
and may replace ``base``, ``seeds``, ``variants`` or
``product`` (e.g. the patch sizes an image size allows), give ``variant_overrides`` (variant name ->
overrides for that variant alone, after its own: values tuned per variant, such as each family's
learning rate at each training-set size), set ``jobs`` (runs at once) and
``threads`` (CPU threads per run), and give ``report`` keys that replace the sweep's for that
profile (e.g. another ``target`` and ``budget_s``). A profile sized for one machine states its
expected time there in ``device_s`` (seconds for all its runs at its seeds: the ``h200`` profiles,
estimated by ``reproductions.sweeping.estimate``).
A variant with a ``paper`` value gives it as a number, or ``{value: x, unverified: true}``.
A variant with a ``base`` runs its own experiment config (e.g. one model per config: WDL, DIN,
BST), which wins over the profile's and the sweep's ``base``; the overrides apply on top as usual.

``load_sweep`` reads a file into a ``Sweep`` (its ``Profile``s, ``Variant``s, ``Reference``
columns and ``Metric``s); every mistake raises ``SweepError`` naming the file and the key.
What the runs are is ``reproductions.sweeping.plan``'s business.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reproductions.run.errors import yaml_error_line

REPO_ROOT = Path(__file__).resolve().parents[2]
REPRODUCTIONS_DIR = REPO_ROOT / "reproductions"
DEFAULT_PROFILE = "cpu"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]*$")
_SWEEP_KEYS = {
    "title", "description", "axis", "base", "seeds", "aliases", "overrides", "variants", "product",
    "references", "claims", "report", "metric", "columns", "profiles",
}  # fmt: skip
_PROFILE_KEYS = {"description", "scale", "base", "configs", "seeds", "jobs", "threads", "overrides", "variants", "product",
                 "variant_overrides", "report", "device_s"}
_SCALE_KEYS = {"axis", "value", "data", "budget", "series"}
#: a profile's ``scale.axis`` -> how its value is named (``dataset``: the value is the data set's name)
SCALE_AXES = {"tokens": "tokens", "train_images": "training images", "samples": "samples", "dataset": "data set",
              "epochs": "epochs", "train_steps": "training steps"}
#: the scale axes that measure the training budget, not the data or the model
BUDGET_AXES = ("epochs", "train_steps")
_VARIANT_KEYS = {"name", "overrides", "paper", "description", "base", "axes"}
_REFERENCE_KEYS = {"label", "scale", "note", "unverified"}
_METRIC_KEYS = {"key", "label", "scale", "digits", "unit", "ceiling"}


class SweepError(ValueError):
    """A sweep file or sweep command that cannot work; the message says what and where."""


# --------------------------------------------------------------------------- the sweep file


@dataclass(frozen=True)
class Reference:
    """One column of paper values: ``scale`` says how the paper prints them (``fraction`` of 1
    or ``percent``); the report shows both as percent."""

    key: str
    label: str
    scale: str = "percent"
    note: str | None = None
    unverified: bool = False


@dataclass(frozen=True)
class PaperValue:
    value: float
    unverified: bool = False


@dataclass
class Variant:
    """One point of the grid: a name (its run directory) and the overrides it sets.

    ``axes`` holds the values as the sweep file writes them (short keys), for the report's
    grouping and plotting; ``overrides`` the full CLI keys; ``base`` the variant's own
    experiment config, if it has one.
    """

    name: str
    overrides: dict[str, Any]
    axes: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, PaperValue] = field(default_factory=dict)
    base: str | None = None


@dataclass(frozen=True)
class Metric:
    """A metric column of the report: ``key`` in results.json's ``test`` (or, without a ``/``, a
    dotted path into results.json: ``best.score``), shown as value x
    ``scale`` with ``digits`` decimals; differences are named in ``unit`` ("+1.20 points");
    ``ceiling``, a dotted path into results.json (``data.ceiling.test_auc``), is the best value
    reachable on that data, if the data knows it (the report adds it as a row)."""

    key: str = "test/acc"
    label: str = "test acc. (%)"
    scale: float = 100.0
    digits: int = 2
    unit: str = "points"
    ceiling: str | None = None


@dataclass(frozen=True)
class Scale:
    """The size a profile runs at: ``axis`` (``SCALE_AXES``), its ``value`` (a number; the data
    set's name on the ``dataset`` axis) and the ``data`` set."""

    axis: str
    value: float | str
    data: str | None = None
    budget: str | None = None  # the training budget where the axis is not one ("4 epochs"), for the label
    # another protocol along the same axis ("shared recipe"): a claim's figure joins a profile's point only to
    # points of its own series, so a line across budgets never passes through a different protocol
    series: str | None = None

    @property
    def label(self) -> str:
        """``16 tokens (digits)``, ``54,000 training images (fashion_mnist)``, ``data set Taobao``; with
        its ``budget``: ``49 tokens (fashion_mnist), 4 epochs``."""
        budget = f", {self.budget}" if self.budget else ""
        if self.axis == "dataset":
            return f"data set {self.value}" + (f" ({self.data})" if self.data and self.data != self.value else "") + budget
        number = f"{int(self.value):,}" if float(self.value).is_integer() else f"{self.value:,g}"
        return f"{number} {SCALE_AXES[self.axis]}" + (f" ({self.data})" if self.data else "") + budget


@dataclass
class Profile:
    name: str
    description: str | None
    base: str | None
    seeds: list[int] | None
    jobs: int | None
    threads: int | None
    overrides: dict[str, Any]
    variants: list[Variant] | None
    configs: list[str] = field(default_factory=list)  # overlay configs after each run's base (a data source)
    scale: Scale | None = None
    report: dict[str, Any] = field(default_factory=dict)  # report keys for this profile, over the sweep's
    device_s: float | None = None  # expected seconds for all its runs on the machine it is sized for


@dataclass
class Sweep:
    path: Path
    id: str  # vit/position
    title: str
    description: str | None
    axis: str
    base: str
    seeds: list[int]
    aliases: dict[str, str]
    overrides: dict[str, Any]
    variants: list[Variant]
    references: list[Reference]
    claims: list[str]
    report: dict[str, Any]
    metric: Metric
    profiles: dict[str, Profile]
    columns: list[Metric] = field(default_factory=list)  # more metric columns after ``metric``

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise SweepError(f"{self.path}: no profile {name!r}; profiles: {sorted(self.profiles)}")
        return self.profiles[name]


def find_sweep(ref: str | os.PathLike) -> Path:
    """``vit/position`` -> reproductions/vit/sweeps/position.yaml; a path to a file is taken as is."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    parts = Path(str(ref).removesuffix(".yaml")).parts
    if len(parts) >= 2:
        candidate = REPRODUCTIONS_DIR.joinpath(*parts[:-1], "sweeps", parts[-1] + ".yaml")
        if candidate.is_file():
            return candidate
    known = sorted(sweep_id(p) for p in REPRODUCTIONS_DIR.glob("*/sweeps/*.yaml"))
    raise SweepError(f"no sweep {str(ref)!r}: give a sweep file or one of {known}")


def sweep_id(path: Path) -> str:
    """reproductions/vit/sweeps/position.yaml -> ``vit/position``; a file elsewhere -> its stem."""
    path = Path(path).resolve()
    try:
        rel = path.relative_to(REPRODUCTIONS_DIR)
    except ValueError:
        return path.stem
    return "/".join(p for p in rel.with_suffix("").parts if p != "sweeps")


def profiles_by_sweep() -> dict[str, list[str]]:
    """Every sweep of the repository (``vit/position``) -> its profiles, in the file's order, read
    from the sweep files themselves (for ``--help``); a file that does not parse lists none."""
    out = {}
    for path in sorted(REPRODUCTIONS_DIR.glob("*/sweeps/*.yaml")):
        try:
            raw = yaml.safe_load(path.read_text())
            names = [str(n) for n in raw["profiles"]]
        except (yaml.YAMLError, TypeError, KeyError, OSError):
            names = []
        out[sweep_id(path)] = names
    return out


def profiles_help() -> str:
    """``--help``'s list of the sweeps and their profiles, one sweep a line."""
    lines = [f"  {sweep}: {', '.join(names) if names else '(the file does not parse)'}"
             for sweep, names in profiles_by_sweep().items()]  # fmt: skip
    return "Sweeps and their profiles (--profile):\n" + "\n".join(lines)


def _check_keys(where: str, mapping: Any, allowed: set[str]) -> dict:
    if not isinstance(mapping, dict):
        raise SweepError(f"{where}: expected a mapping, got {type(mapping).__name__} {mapping!r}")
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise SweepError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return mapping


def _check_name(where: str, name: Any) -> str:
    name = str(name)
    if not _NAME.match(name):
        raise SweepError(
            f"{where}: variant name {name!r} must be letters, digits and . _ = , + - "
            "(it names a directory; no '/' or spaces)"
        )
    return name


def _seeds(where: str, value: Any) -> list[int]:
    if isinstance(value, bool):
        raise SweepError(f"{where}: seeds={value!r} must be a count or a list of integers")
    if isinstance(value, int):
        if value < 1:
            raise SweepError(f"{where}: seeds={value} must be at least 1")
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        if len(set(value)) != len(value):
            raise SweepError(f"{where}: seeds {value} repeat a seed")
        return list(value)
    raise SweepError(f"{where}: seeds={value!r} must be a count or a non-empty list of integers")


def _format_value(value: Any) -> str:
    """How an axis value appears in a variant name: 0.001 -> 0.001, 3e-4 -> 0.0003, True -> true."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _expand(where: str, spec: dict, aliases: dict[str, str]) -> list[Variant]:
    """Variants of a ``variants:`` list, a ``product:`` of axes, or both: every listed variant
    crossed with every point of the product (its name ``<variant>,<axis>=<value>,...``, its
    overrides the variant's then the point's, its axes both)."""
    if "variants" not in spec and "product" not in spec:
        raise SweepError(f"{where}: give 'variants' (a list), 'product' (axes) or both")
    resolve = lambda d: {aliases.get(k, k): v for k, v in d.items()}  # noqa: E731
    variants: list[Variant] = []
    if "variants" in spec:
        items = spec["variants"]
        if not isinstance(items, list) or not items:
            raise SweepError(f"{where}.variants: expected a non-empty list of {{name, overrides, paper}}")
        for i, item in enumerate(items):
            w = f"{where}.variants[{i}]"
            _check_keys(w, item, _VARIANT_KEYS)
            if "name" not in item:
                raise SweepError(f"{w}: every variant needs a name")
            overrides = _check_keys(f"{w}.overrides", item.get("overrides") or {}, set(item.get("overrides") or {}))
            paper = {}
            for col, val in (item.get("paper") or {}).items():
                if isinstance(val, dict):
                    _check_keys(f"{w}.paper.{col}", val, {"value", "unverified"})
                    paper[col] = PaperValue(float(val["value"]), bool(val.get("unverified", False)))
                else:
                    paper[col] = PaperValue(float(val))
            base = item.get("base")
            if base is not None and not isinstance(base, str):
                raise SweepError(f"{w}.base: expected a config path, got {base!r}")
            named_axes = _check_keys(f"{w}.axes", item.get("axes") or {}, set(item.get("axes") or {}))
            variants.append(Variant(
                _check_name(w, item["name"]), resolve(overrides), axes={**overrides, **named_axes}, paper=paper, base=base,
            ))  # fmt: skip
    if "product" in spec:
        points: list[Variant] = []
        listed = isinstance(spec["product"], list)
        grids = spec["product"] if listed else [spec["product"]]
        if not grids:
            raise SweepError(f"{where}.product: expected a mapping of axis -> list of values (or a list of them)")
        axes: dict[str, Any] = {}
        for g, grid in enumerate(grids):
            w = f"{where}.product" + (f"[{g}]" if listed else "")
            if not isinstance(grid, dict) or not grid:
                raise SweepError(f"{w}: expected a mapping of axis -> list of values")
            if axes and list(grid) != list(axes):
                raise SweepError(f"{w}: axes {list(grid)}, but the first grid's are {list(axes)}; every grid names the "
                                 "same axes in the same order")  # fmt: skip
            axes = grid
            choices = []
            for axis, values in grid.items():
                if not isinstance(values, list) or not values:
                    raise SweepError(f"{w}.{axis}: expected a non-empty list of values")
                choices.append([(axis, v) for v in values])
            for combo in itertools.product(*choices):
                name = ",".join(f"{axis}={_format_value(v)}" for axis, v in combo)
                set_ = dict(combo)
                points.append(Variant(_check_name(w, name), resolve(set_), axes=set_))
        if variants:
            for v in variants:
                if set(v.axes) & set(axes):
                    raise SweepError(f"{where}: variant {v.name!r} sets {sorted(set(v.axes) & set(axes))}, an axis of 'product'")
            variants = [
                Variant(f"{v.name},{p.name}", {**v.overrides, **p.overrides}, axes={**v.axes, **p.axes}, paper=v.paper, base=v.base)
                for v in variants for p in points
            ]  # fmt: skip
        else:
            variants = points
    names = [v.name for v in variants]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SweepError(f"{where}: variant names repeat: {dupes}")
    return variants


def _profile_grid(raw: dict, spec: dict) -> dict:
    """A profile's grid: its ``variants``/``product``; where the sweep crosses both and the profile
    gives one (e.g. CIFAR's training-set sizes), the profile's crossed with the sweep's other."""
    grid = {k: spec[k] for k in ("variants", "product") if k in spec}
    if "variants" in raw and "product" in raw:
        for k in ("variants", "product"):
            grid.setdefault(k, raw[k])
    return grid


def load_sweep(ref: str | os.PathLike) -> Sweep:
    """Read and check a sweep file; every mistake names the file and the key."""
    path = find_sweep(ref)
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        raise SweepError(yaml_error_line(e, text, str(path))) from e
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from e
    where = str(path)
    _check_keys(where, raw, _SWEEP_KEYS)
    for key in ("axis", "base", "profiles"):
        if key not in raw:
            raise SweepError(f"{where}: missing {key!r}")
    aliases = _check_keys(f"{where}.aliases", raw.get("aliases") or {}, set(raw.get("aliases") or {}))
    references = []
    for key, ref_spec in (raw.get("references") or {}).items():
        _check_keys(f"{where}.references.{key}", ref_spec, _REFERENCE_KEYS)
        scale = ref_spec.get("scale", "percent")
        if scale not in ("percent", "fraction"):
            raise SweepError(f"{where}.references.{key}.scale={scale!r}: use 'percent' or 'fraction'")
        references.append(
            Reference(key, str(ref_spec.get("label", key)), scale, ref_spec.get("note"), bool(ref_spec.get("unverified", False)))
        )
    variants = _expand(where, raw, aliases)
    known_refs = {r.key for r in references}
    profiles = {}
    for name, spec in raw["profiles"].items():
        w = f"{where}.profiles.{name}"
        spec = _check_keys(w, spec or {}, _PROFILE_KEYS)
        jobs, threads = spec.get("jobs"), spec.get("threads")
        for key, value in (("jobs", jobs), ("threads", threads)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SweepError(f"{w}.{key}={value!r} must be a positive integer")
        profile_overrides = _check_keys(f"{w}.overrides", spec.get("overrides") or {}, set(spec.get("overrides") or {}))
        configs = spec.get("configs") or []
        if not isinstance(configs, list) or not all(isinstance(c, str) for c in configs):
            raise SweepError(f"{w}.configs={configs!r}: expected a list of config paths")
        device_s = spec.get("device_s")
        if device_s is not None and (isinstance(device_s, bool) or not isinstance(device_s, (int, float)) or device_s <= 0):
            raise SweepError(f"{w}.device_s={device_s!r} must be a positive number of seconds (the expected device time)")
        report = spec.get("report") or {}
        if not isinstance(report, dict):
            raise SweepError(f"{w}.report={report!r}: expected a mapping of report keys (e.g. {{target: 0.93, budget_s: 600}})")
        profile_variants = _expand(w, _profile_grid(raw, spec), aliases) if ("variants" in spec or "product" in spec) else None
        if "variant_overrides" in spec:
            profile_variants = _variant_overrides(f"{w}.variant_overrides", spec["variant_overrides"],
                                                  profile_variants or variants, aliases)
        profiles[name] = Profile(
            name=str(name),
            description=spec.get("description"),
            base=spec.get("base"),
            seeds=_seeds(f"{w}.seeds", spec["seeds"]) if "seeds" in spec else None,
            jobs=jobs,
            threads=threads,
            overrides={aliases.get(k, k): v for k, v in profile_overrides.items()},
            variants=profile_variants,
            configs=configs,
            scale=_scale(f"{w}.scale", spec["scale"]) if "scale" in spec else None,
            report=dict(report),
            device_s=device_s,
        )
    for v in variants + [v for p in profiles.values() for v in (p.variants or [])]:
        unknown = sorted(set(v.paper) - known_refs)
        if unknown:
            raise SweepError(f"{where}: variant {v.name!r} has paper values for unknown references {unknown}")
    metric = _metric(f"{where}.metric", raw.get("metric") or {})
    columns_spec = raw.get("columns") or []
    if not isinstance(columns_spec, list):
        raise SweepError(f"{where}.columns: expected a list of {{key, label, scale, digits, unit, ceiling}}")
    columns = []
    for i, spec in enumerate(columns_spec):
        if not isinstance(spec, dict) or "key" not in spec:
            raise SweepError(f"{where}.columns[{i}]: every column needs a key (a test metric, e.g. test/gauc)")
        columns.append(_metric(f"{where}.columns[{i}]", {"label": spec["key"], **spec}))
    keys = [m.key for m in [metric, *columns]]
    if len(set(keys)) != len(keys):
        raise SweepError(f"{where}: metric and columns repeat a key: {keys}")
    return Sweep(
        path=path,
        id=sweep_id(path),
        title=str(raw.get("title", sweep_id(path))),
        description=raw.get("description"),
        axis=str(raw["axis"]),
        base=str(raw["base"]),
        seeds=_seeds(f"{where}.seeds", raw.get("seeds", 1)),
        aliases=dict(aliases),
        overrides={aliases.get(k, k): v for k, v in (raw.get("overrides") or {}).items()},
        variants=variants,
        references=references,
        claims=[str(c) for c in raw.get("claims") or []],
        report=dict(raw.get("report") or {}),
        metric=metric,
        profiles=profiles,
        columns=columns,
    )


def _variant_overrides(where: str, spec: Any, variants: list[Variant], aliases: dict[str, str]) -> list[Variant]:
    """The profile's variants with ``spec`` (variant name -> overrides) applied after each named
    variant's own overrides; a name the profile does not have is an error listing its variants."""
    spec = _check_keys(where, spec, {v.name for v in variants})
    out = []
    for v in variants:
        extra = spec.get(v.name) or {}
        extra = _check_keys(f"{where}.{v.name}", extra, set(extra))
        out.append(Variant(v.name, {**v.overrides, **{aliases.get(k, k): x for k, x in extra.items()}},
                           axes=dict(v.axes), paper=v.paper, base=v.base))  # fmt: skip
    return out


def _scale(where: str, spec: Any) -> Scale:
    """A profile's ``scale``: ``{axis, value, data}`` (see ``Scale``), or a SweepError naming it."""
    spec = _check_keys(where, spec, _SCALE_KEYS)
    axis, value, data = spec.get("axis"), spec.get("value"), spec.get("data")
    if axis not in SCALE_AXES:
        raise SweepError(f"{where}.axis={axis!r} is not one of {list(SCALE_AXES)}")
    if axis == "dataset":
        if not isinstance(value, str) or not value.strip():
            raise SweepError(f"{where}.value={value!r}: on the dataset axis the value is the data set's name")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SweepError(f"{where}.value={value!r} must be a positive number of {SCALE_AXES[axis]}")
    if data is not None and (not isinstance(data, str) or not data.strip()):
        raise SweepError(f"{where}.data={data!r} must be the data set's name")
    budget = spec.get("budget")
    if budget is not None and (axis in BUDGET_AXES or not isinstance(budget, str) or not budget.strip()):
        raise SweepError(f"{where}.budget={budget!r} must be the training budget in words (\"4 epochs\"), on a "
                         f"scale whose axis is not itself a budget ({', '.join(BUDGET_AXES)})")
    series = spec.get("series")
    if series is not None and (not isinstance(series, str) or not series.strip()):
        raise SweepError(f"{where}.series={series!r} must name the protocol in words (\"shared recipe\")")
    return Scale(str(axis), value, data, budget, series)


def _metric(where: str, spec: Any) -> Metric:
    spec = dict(_check_keys(where, spec, _METRIC_KEYS))
    digits = spec.get("digits", Metric.digits)
    if not isinstance(digits, int) or isinstance(digits, bool) or not 0 <= digits <= 8:
        raise SweepError(f"{where}.digits={digits!r} must be an integer in [0, 8]")
    if "scale" in spec and (not isinstance(spec["scale"], (int, float)) or spec["scale"] <= 0):
        raise SweepError(f"{where}.scale={spec['scale']!r} must be a positive number")
    return Metric(**spec)
