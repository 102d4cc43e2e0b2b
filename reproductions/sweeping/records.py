"""The results registry: one compact record per finished run of a sweep profile, kept in the
repository (``results/``), read by everything that shows results (reports, the claims page, the
README tables) beside any local runs.

A record is a few KB of JSON at ``results/<paper>/<sweep>/<profile>/<variant>/seed<k>-<id>.json``:

- who it is: ``sweep`` (``vit/patch_size``), ``profile``, ``variant``, ``seed``, ``experiment``
  and ``id``, the run's identity (a digest of its experiment, variant, seed, config digest, host,
  hardware and finish time: the same run added twice has the same id, so it is refused);
- what ran: ``config`` (the run's resolved ``config.yaml`` as flat dotted keys, leaving out what
  names the run or where its files lie: ``run``, ``config`` and ``LOCATION_KEYS``; callbacks that
  only analyse the trained model, ``ANALYSIS_CALLBACKS``, are left out of ``trainer.callbacks``),
  ``config_digest`` (its sha256) and ``overrides`` (every key where the run's config differs from
  what the sweep file defined for its variant and seed when the record was added: ``{key: {"run":
  value, "definition": value}}``; empty for a run made by ``repro sweep`` from the sweep file as
  it is). Keys that only one side has are not differences: an option added to the code since
  (the definition has it at its default, the run predates it) or removed since;
- what it measured, at the same paths as ``results.json`` so every reader works on both:
  ``test``, ``test_ckpt``, ``final``, ``best`` (monitor, score), ``model`` (params, FLOPs per
  sample), ``training`` (epochs, steps, batch, samples seen, total FLOPs, fit time, throughput),
  ``data`` (the DataModule's description), ``plateau`` (whether the validation metric stopped
  improving, reproductions/run/curve.py; older records have none and are read from their curve),
  and ``curve``: every validation of the fit
  (``columns``: step, epoch, ``time/fit_elapsed_s`` and the validation metrics; ``rows``);
  ``attention_distance``: the mean attention distance per layer and head when the fit measured
  it (a ViT);
- where: ``hardware``, ``versions``, ``git`` (commit, dirty), ``host``, ``finished_at``,
  ``reused_from`` (``<experiment>/<variant>/seed<k>`` of the run a ``--reuse`` copy came from).

No local path is kept: absolute paths in the run's description (a cache folder, a data folder)
are cut to their last component, and the run directory, checkpoint paths and command line are
left out (the overrides say how the run differed from the sweep file).

``SCHEMA`` is the record's version; ``validate`` checks a record on every read and raises
``RecordError`` with one line naming the file and the field. Layer: beside ``collect`` (imports
spec, plan and results; reuse for the config digest).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproductions.run.curve import finite_or_none, plateau, read_curve, run_plateau
from reproductions.run.results import RESULTS_FILE, results_state
from reproductions.sweeping.spec import REPO_ROOT, SweepError, profiles_by_sweep
from utils.atomic import atomic_write_json

SCHEMA = 1
#: the registry of the repository
REGISTRY_DIR = REPO_ROOT / "results"
RECORD_SUFFIX = ".json"
#: the registry's folder of pixel floors (``reproductions.sweeping.floors``), not run records
FLOORS_DIR_NAME = "floors"
#: resolved-config keys that say where files lie or how a run reports progress, not what it
#: computes: left out of the digests and the overrides
LOCATION_KEYS = (
    "data.init_args.data_dir", "data.init_args.cache_dir", "data.init_args.prepared", "data.init_args.num_workers",
    "data.init_args.prepare_workers", "data.init_args.persistent_workers", "data.init_args.pin_memory",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.default_root_dir",
    "trainer.log_every_n_steps",
)  # fmt: skip
#: callbacks that analyse the trained model at the end of a fit and change nothing it computes: left
#: out of ``trainer.callbacks`` in the digests and the comparisons (a run whose config listed one and a
#: run that was given it by the command line computed the same)
ANALYSIS_CALLBACKS = ("analysis.callback.AttentionDistanceCallback",)
#: the profile whose runs are for tests only: never a result (nor is any ``smoke-<name>`` profile)
SMOKE_PROFILE = "smoke"


def is_smoke(profile: str) -> bool:
    """A profile for tests (seconds per run), never a result: ``smoke`` or ``smoke-<name>``."""
    return profile == SMOKE_PROFILE or profile.startswith(SMOKE_PROFILE + "-")
_DISTANCE_FILE = Path("analysis") / "attention_distance.json"


class RecordError(ValueError):
    """A record that is not valid, or a run that cannot be recorded; one line, naming the file."""


# --------------------------------------------------------------------------- configs and digests


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: leaf value}`` (lists are leaves)."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def computed_part(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened keys of a resolved config that say what a run computes (no ``run``,
    ``config`` or ``LOCATION_KEYS``; no ``ANALYSIS_CALLBACKS``)."""
    return _without_analysis({k: v for k, v in flatten(config).items()
                              if k.split(".", 1)[0] not in ("run", "config") and k not in LOCATION_KEYS})  # fmt: skip


def _without_analysis(flat: dict[str, Any]) -> dict[str, Any]:
    """``trainer.callbacks`` without the ``ANALYSIS_CALLBACKS`` (none left: ``None``, as a config without any)."""
    callbacks = flat.get("trainer.callbacks")
    if isinstance(callbacks, list):
        kept = [c for c in callbacks if not (isinstance(c, dict) and c.get("class_path") in ANALYSIS_CALLBACKS)]
        flat = {**flat, "trainer.callbacks": kept or None}
    return flat


def config_digest(config: dict[str, Any]) -> str:
    text = json.dumps(computed_part(config), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def config_differences(run: dict[str, Any], definition: dict[str, Any], *, flat: bool = False) -> dict[str, dict[str, Any]]:
    """Every computed key that both configs have whose value differs between the run's and the
    definition's (``flat``: the run's config is already ``computed_part``'s flat keys)."""
    a, b = _without_analysis(run) if flat else computed_part(run), computed_part(definition)
    return {k: {"run": a[k], "definition": b[k]} for k in sorted(set(a) & set(b)) if a[k] != b[k]}


_DEFINITIONS: dict[tuple[str, str, str, str], dict[str, Any]] = {}
_PLANS: dict[tuple[str, str, str], Any] = {}
_SHAPES: dict[tuple[str, ...], dict[str, Any]] = {}  # a resolved config per shape (``split_derived``)

# Arguments a tuning grid varies whose resolved value is the argument itself: a variant that differs
# from an already resolved one in these alone gets that one's config with them set (a float, a string).
DERIVED_ARGS: dict[str, tuple[tuple[str, ...], type]] = {
    "--model.init_args.lr": (("model", "init_args", "lr"), float),
    "--model.init_args.weight_decay": (("model", "init_args", "weight_decay"), float),
    "--run.variant": (("run", "variant"), str),
    "--seed_everything": (("seed_everything",), int),
}


def split_derived(args: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``args`` without the ``DERIVED_ARGS`` (the run's shape), and their values."""
    shape: list[str] = []
    values: dict[str, str] = {}
    it = iter(args)
    for a in it:
        if a in DERIVED_ARGS:
            values[a] = next(it, "")
        else:
            shape.append(a)
    return tuple(shape), values


def _derive(config: dict[str, Any], values: dict[str, str]) -> dict[str, Any] | None:
    """``config`` with the derived arguments set to ``values``, or None where a value is not what
    the resolved config holds at its place (not a number, or the place missing or of another type)."""
    out = copy.deepcopy(config)
    for flag, text in values.items():
        path, kind = DERIVED_ARGS[flag]
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or type(node.get(path[-1])) is not kind:
            return None
        try:
            node[path[-1]] = kind(text)
        except ValueError:
            return None
    return out


def resolved_config(args: Sequence[str]) -> dict[str, Any] | None:
    """The config the CLI resolves ``args`` (a run's arguments) to; runs that differ only in
    ``DERIVED_ARGS`` (seed, lr, weight decay, variant name) share one resolution in this process."""
    from reproductions.sweeping.reuse import load_config, resolve_config

    shape, values = split_derived(args)
    if shape in _SHAPES:
        config = _derive(_SHAPES[shape], values)
        if config is not None:
            return config
    config = load_config(resolve_config(args))
    if config is not None and _derive(config, values) == config:  # each derived value lands where the CLI put it
        _SHAPES[shape] = copy.deepcopy(config)
    return config


def definition_config(sweep_id: str, profile: str, variant: str, seed: int) -> dict[str, Any]:
    """The resolved config the sweep file defines now for one variant and seed (no run is made).
    The seed enters a resolved config as ``seed_everything`` alone, so one resolution per variant
    serves every seed (kept for this process, keyed by the sweep file's text); the variants of a
    tuning grid that differ only in ``DERIVED_ARGS`` share one resolution."""
    from reproductions.sweeping.plan import make_plan
    from reproductions.sweeping.spec import find_sweep

    key = (sweep_id, profile, variant, find_sweep(sweep_id).read_text())
    if key not in _DEFINITIONS:
        plan_key = (sweep_id, profile, key[3])
        if plan_key not in _PLANS:
            _PLANS[plan_key] = make_plan(sweep_id, profile, seeds=None)
        plan = _PLANS[plan_key]
        runs = [r for r in plan.runs if r.variant.name == variant]
        if not runs:
            raise RecordError(f"{sweep_id} profile {profile}: no variant {variant!r}; variants: {[v.name for v in plan.variants]}")
        config = resolved_config(runs[0].args)
        if config is None:  # pragma: no cover - the CLI always dumps a mapping
            raise RecordError(f"{sweep_id} profile {profile} variant {variant}: the sweep's config does not resolve")
        _DEFINITIONS[key] = config
    return {**_DEFINITIONS[key], "seed_everything": seed}


# --------------------------------------------------------------------------- schema


def is_number(v: Any) -> bool:
    """A real number: an int or float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _metrics(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and (v[k] is None or is_number(v[k])) for k in v)


def _curve(v: Any) -> bool:
    if not isinstance(v, dict) or not isinstance(v.get("columns"), list) or not isinstance(v.get("rows"), list):
        return False
    width = len(v["columns"])
    return all(isinstance(c, str) for c in v["columns"]) and all(
        isinstance(row, list) and len(row) == width and all(x is None or is_number(x) for x in row) for row in v["rows"])


#: field -> (check, what it must be); fields marked optional may be absent
FIELDS: dict[str, tuple[Any, str, bool]] = {
    "schema": (lambda v: v == SCHEMA, f"the number {SCHEMA}", True),
    "id": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{12}", v) is not None, "12 hex digits", True),
    "sweep": (lambda v: isinstance(v, str) and "/" in v, "a sweep id such as vit/position", True),
    "profile": (lambda v: isinstance(v, str) and bool(v), "a profile name", True),
    "variant": (lambda v: isinstance(v, str) and bool(v), "a variant name", True),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a seed (integer >= 0)", True),
    "experiment": (lambda v: isinstance(v, str) and bool(v), "the experiment name", True),
    "config": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v), "an object of dotted key -> value", True),
    "config_digest": (lambda v: isinstance(v, str) and v.startswith("sha256:"), "sha256:<hex>", True),
    "overrides": (lambda v: isinstance(v, dict) and all(isinstance(x, dict) and set(x) == {"run", "definition"} for x in v.values()),
                  'an object {key: {"run": value, "definition": value}}', True),
    "test": (_metrics, "an object of metric -> number", True),
    "test_ckpt": (lambda v: v is None or isinstance(v, str), "final, best or null", True),
    "final": (_metrics, "an object of metric -> number", True),
    "best": (lambda v: isinstance(v, dict) and (v.get("score") is None or is_number(v.get("score"))), "an object with a numeric score", True),
    "model": (lambda v: isinstance(v, dict), "an object (params, flops_per_sample)", True),
    "training": (lambda v: isinstance(v, dict) and is_number(v.get("fit_time_s")), "an object with a numeric fit_time_s", True),
    "data": (lambda v: isinstance(v, dict), "an object (the data's description)", True),
    "curve": (_curve, "an object {columns: [names], rows: [[numbers or null] of that width]}", True),
    "hardware": (lambda v: isinstance(v, dict) and isinstance(v.get("device"), str), "an object with a device", True),
    "versions": (lambda v: isinstance(v, dict), "an object of package -> version", True),
    "git": (lambda v: isinstance(v, dict), "an object (commit, dirty)", True),
    "host": (lambda v: v is None or isinstance(v, str), "a host name or null", True),
    "finished_at": (lambda v: isinstance(v, str) and bool(v), "an ISO time", True),
    "attention_distance": (lambda v: isinstance(v, dict) and isinstance(v.get("attention_distance"), list),
                           "the run's analysis/attention_distance.json (an object with an attention_distance list)", False),
    "reused_from": (lambda v: v is None or isinstance(v, str), "<experiment>/<variant>/seed<k> or null", False),
    "plateau": (lambda v: isinstance(v, dict) and v.get("reached") in (True, False, None),
                "an object with reached: true, false or null (reproductions/run/curve.py)", False),
}  # fmt: skip


def validate(data: Any, where: str | os.PathLike) -> dict[str, Any]:
    """``data`` if it is a valid record, else ``RecordError`` naming ``where`` and the field."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: not a results record (a JSON object); delete it or add the run again")
    if data.get("schema") != SCHEMA and isinstance(data.get("schema"), int):
        raise RecordError(f"{where}: field 'schema' is {data['schema']}, this code reads schema {SCHEMA}; "
                          "update the repository or add the run again with this version")  # fmt: skip
    for name, (check, what, required) in FIELDS.items():
        if name not in data:
            if required:
                raise RecordError(f"{where}: field {name!r} is missing (schema {SCHEMA}: {what}); add the run again")
            continue
        if not check(data[name]):
            shown = json.dumps(data[name])[:80]
            raise RecordError(f"{where}: field {name!r} is {shown}, not {what} (schema {SCHEMA}); fix it or add the run again")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RecordError(f"{where}: unknown field {unknown[0]!r} (schema {SCHEMA} has {', '.join(FIELDS)}); remove it")
    return data


@dataclass(frozen=True)
class Record:
    path: Path
    data: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str, int]:
        d = self.data
        return d["sweep"], d["profile"], d["variant"], d["seed"]

    def results(self) -> dict[str, Any]:
        """The record as the readers of results.json see it (``source``: ``registry``)."""
        return {"status": "finished", **self.data, "source": "registry", "record": str(self.path)}


def read_record(path: str | os.PathLike) -> Record:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise RecordError(f"{path}: cannot be read ({e.strerror or e}); check the file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: not valid JSON ({e}); restore it from git or add the run again") from None
    return Record(path, validate(data, shown_path(path)))


def shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def record_files(registry: str | os.PathLike = REGISTRY_DIR) -> list[Path]:
    """Every run record under ``registry`` (the pixel floors in its ``floors/`` are data of another kind)."""
    root = Path(registry)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*" + RECORD_SUFFIX) if p.is_file() and FLOORS_DIR_NAME not in p.relative_to(root).parts[:1])


def read_registry(registry: str | os.PathLike = REGISTRY_DIR) -> list[Record]:
    """Every record under ``registry``, each validated (the first bad one raises ``RecordError``)."""
    return [read_record(p) for p in record_files(registry)]


def records_of(sweep_id: str, profile: str, registry: str | os.PathLike = REGISTRY_DIR) -> list[Record]:
    folder = Path(registry) / sweep_id / profile
    return [r for r in read_registry(folder) if r.data["sweep"] == sweep_id and r.data["profile"] == profile]


def recorded_twins(runs: Sequence[Any], sweep_id: str, profile: str,
                   registry: str | os.PathLike | None = None) -> dict[int, Record]:
    """``id(run)`` -> the registry record that already holds that run: the same sweep, profile,
    variant and seed, and a ``config_digest`` equal to the digest of the config the run's command
    resolves to now (extra overrides, another sweep file or another code default all change it).
    For ``repro sweep --skip-recorded``: a campaign whose run directories are gone (another machine,
    a cleaned disk) does not train its recorded runs again."""
    by_key: dict[tuple[str, int], list[Record]] = {}
    for record in records_of(sweep_id, profile, REGISTRY_DIR if registry is None else registry):
        by_key.setdefault((record.data["variant"], record.data["seed"]), []).append(record)
    twins: dict[int, Record] = {}
    for run in runs:
        candidates = by_key.get((run.variant.name, run.seed))
        if not candidates:
            continue
        config = resolved_config(run.args)
        digest = config_digest(config) if config is not None else None
        match = next((r for r in candidates if r.data["config_digest"] == digest), None)
        if match is not None:
            twins[id(run)] = match
    return twins


def record_path(registry: str | os.PathLike, data: dict[str, Any]) -> Path:
    return Path(registry) / data["sweep"] / data["profile"] / data["variant"] / f"seed{data['seed']}-{data['id']}{RECORD_SUFFIX}"


# --------------------------------------------------------------------------- making a record


def run_id(results: dict[str, Any], digest: str) -> str:
    parts = [results.get("experiment"), results.get("variant"), results.get("seed"), digest, results.get("host"),
             results.get("hardware"), results.get("finished_at")]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: an absolute path inside a string (two or more components): kept as ``.../<last component>``
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])/(?:[\w.+@=,-]+/)+([\w.+@=,-]+)")


def scrub_paths(value: Any) -> Any:
    """Absolute paths, alone or inside a string, cut to their last component (no local path goes
    into the repository)."""
    if isinstance(value, dict):
        return {k: scrub_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_paths(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value) and len(value) > 1:
        return ".../" + Path(value).name
    if isinstance(value, str):
        return _ABSOLUTE.sub(r".../\1", value)
    return value


def _distance(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``analysis/attention_distance.json`` without its figure paths, or None."""
    try:
        data = json.loads((run_dir / _DISTANCE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("attention_distance"), list):
        return None
    return {k: v for k, v in data.items() if k != "figures"}


def reused_run(reused: Any) -> str:
    """``<experiment>/<variant>/seed<k>`` of the run a ``--reuse`` copy came from (its results.json's
    ``reused_from`` names the source's run directory, ``<root>/<paper>/<name>/<variant>/seed<k>``)."""
    run_dir = reused.get("run_dir") if isinstance(reused, dict) else reused
    return "/".join(Path(str(run_dir)).parts[-4:])


def make_record(run_dir: Path, results: dict[str, Any], config: dict[str, Any], sweep_id: str, profile: str,
                definition: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The registry record of a finished run (see the module docstring)."""
    digest = config_digest(config)
    best = results.get("best") or {}
    curve = read_curve(run_dir / "metrics.csv")
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "id": run_id(results, digest),
        "sweep": sweep_id,
        "profile": profile,
        "variant": results["variant"],
        "seed": int(results["seed"]),
        "experiment": results["experiment"],
        "config": scrub_paths(computed_part(config)),
        "config_digest": digest,
        "overrides": scrub_paths(config_differences(config, definition)),
        "test": {k: finite_or_none(v) for k, v in (results.get("test") or {}).items()},
        "test_ckpt": results.get("test_ckpt"),
        "final": {k: finite_or_none(v) for k, v in (results.get("final") or {}).items()},
        "best": {"monitor": best.get("monitor"), "score": finite_or_none(best.get("score"))},
        "model": results.get("model") or {},
        "training": results.get("training") or {},
        "data": scrub_paths(results.get("data") or {}),
        "curve": curve,
        "plateau": results.get("plateau") or plateau(curve, best.get("monitor"),
                                                     val_size=(results.get("data") or {}).get("val_size")),
        "hardware": results.get("hardware") or {"device": "unknown"},
        "versions": results.get("versions") or {},
        "git": {k: v for k, v in (results.get("git") or {}).items() if k in ("commit", "dirty")},
        "host": results.get("host"),
        "finished_at": str(results.get("finished_at") or ""),
    }
    distance = _distance(run_dir)
    if distance is not None:
        record["attention_distance"] = distance
    if results.get("reused_from"):
        record["reused_from"] = reused_run(results["reused_from"])
    return validate(record, run_dir / RESULTS_FILE)


# --------------------------------------------------------------------------- adding runs


def sweep_of_experiment(experiment: str) -> tuple[str, str] | None:
    """``vit/position-cpu`` -> (``vit/position``, ``cpu``): the sweep and profile whose default
    experiment name it is, or None."""
    for sweep_id, profiles in profiles_by_sweep().items():
        for profile in profiles:
            if experiment == f"{sweep_id}-{profile}":
                return sweep_id, profile
    return None


def run_dirs(path: str | os.PathLike) -> list[Path]:
    """The run directories under ``path`` (``seed<k>`` folders with a results.json or a
    config.yaml; ``path`` itself if it is one), in path order."""
    path = Path(path)
    found = set()
    for marker in (RESULTS_FILE, "config.yaml"):
        found.update(p.parent for p in path.rglob(marker) if p.parent.name.startswith("seed"))
    if path.name.startswith("seed") and ((path / RESULTS_FILE).exists() or (path / "config.yaml").exists()):
        found.add(path)
    return sorted(found)


@dataclass
class AddOutcome:
    run_dir: Path
    added: Path | None = None  # the record written
    refused: str | None = None  # why not


def add_runs(path: str | os.PathLike, registry: str | os.PathLike = REGISTRY_DIR, *, allow_changed: bool = False,
             dry_run: bool = False) -> list[AddOutcome]:  # fmt: skip
    """Record every finished sweep run under ``path`` (see ``add_run``); one outcome per run directory."""
    existing = {r.data["id"]: r.path for r in read_registry(registry)}
    return [add_run(d, registry, existing, allow_changed=allow_changed, dry_run=dry_run) for d in run_dirs(path)]


def add_run(run_dir: Path, registry: str | os.PathLike, existing: dict[str, Path], *,
            allow_changed: bool = False, dry_run: bool = False) -> AddOutcome:  # fmt: skip
    """Record one run, or say why not: not finished (failed, interrupted, still running, a corrupt
    results.json), not a sweep profile's run, a smoke run, a variant the sweep no longer has, a
    config that differs from what the sweep file defines now (unless ``allow_changed``: the
    differences go into ``overrides``), or already in the registry."""
    out = AddOutcome(run_dir)
    state, results = results_state(run_dir)
    if state != "finished" or results is None:
        why = {"missing": "no results.json (unfinished or still running)", "corrupt": "its results.json is corrupt"}
        out.refused = f"not finished: {why.get(state, f'status {state}')}"
        return out
    experiment = str(results.get("experiment"))
    found = sweep_of_experiment(experiment)
    if found is None:
        out.refused = f"experiment {experiment!r} is not a sweep profile's (<sweep>-<profile>, as repro sweep names it)"
        return out
    sweep_id, profile = found
    if is_smoke(profile):
        out.refused = f"a {profile!r} run (seconds, for tests): not a result"
        return out
    if not (run_dir / "config.yaml").is_file():
        out.refused = "no config.yaml: the run's resolved config is needed for its digest"
        return out
    from reproductions.sweeping.reuse import run_config

    config = run_config(run_dir)  # a run resumed from its own checkpoint reads as the uninterrupted run
    if config is None:
        out.refused = "its config.yaml does not parse"
        return out
    try:
        definition = definition_config(sweep_id, profile, str(results.get("variant")), int(results.get("seed", 0)))
    except (RecordError, SweepError) as e:
        out.refused = str(e)
        return out
    diffs = config_differences(config, definition)
    if diffs and not allow_changed:
        shown = "; ".join(f"{k}: {d['run']!r} in the run, {d['definition']!r} in the sweep file" for k, d in list(diffs.items())[:6])
        more = f" (and {len(diffs) - 6} more)" if len(diffs) > 6 else ""
        out.refused = (f"its config differs from what {sweep_id} profile {profile} defines now: {shown}{more}; rerun it, "
                       "or add it with --allow-changed to record the differences as overrides")  # fmt: skip
        return out
    record = make_record(run_dir, results, config, sweep_id, profile, definition)
    if record["id"] in existing:
        out.refused = f"already in the registry: {shown_path(existing[record['id']])}"
        return out
    target = record_path(registry, record)
    if not dry_run:
        atomic_write_json(target, record)
    existing[record["id"]] = target
    out.added = target
    return out


def stale_plateaus(records: Iterable[Record]) -> Iterator[tuple[Record, dict[str, Any]]]:
    """Records whose recorded ``plateau`` is not what the rule reads from their curve now, each with
    the plateau it reads (a record without one is read from its curve anyway: ``run_plateau``)."""
    for rec in records:
        if isinstance(rec.data.get("plateau"), dict):
            now = run_plateau(rec.data, reread=True)
            if now != rec.data["plateau"]:
                yield rec, now


def stale_records(records: Iterable[Record]) -> Iterator[tuple[Record, str]]:
    """Records whose sweep definition changed since they were added: the sweep file now defines,
    for their variant and seed, a config that differs from theirs in other keys than the
    differences they recorded (``overrides``); a variant or profile the sweep no longer has, too."""
    for rec in records:
        if is_smoke(rec.data["profile"]):
            continue
        try:
            definition = definition_config(*rec.key)
        except (RecordError, SweepError) as e:
            yield rec, str(e)
            continue
        now = config_differences(rec.data["config"], scrub_paths(definition), flat=True)
        recorded = rec.data["overrides"]
        changed = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
        if changed:
            shown = ", ".join(f"{k} (recorded {recorded.get(k, {}).get('definition', rec.data['config'].get(k))!r}, "
                              f"now {computed_part(definition).get(k)!r})" for k in changed[:3])  # fmt: skip
            yield rec, (f"the sweep file's config for {rec.data['variant']} seed {rec.data['seed']} changed since it was added: "
                        f"{shown}" + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))  # fmt: skip
