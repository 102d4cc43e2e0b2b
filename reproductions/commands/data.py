"""``repro data prepare|info``: prepare image data ahead of time, and show what is prepared.

    repro data prepare --config reproductions/vit/configs/imagenet_vit_b16.yaml \\
        --data.data_dir /data/imagenet                      # the config's data, with the same overrides as fit
    repro data prepare --source folder --data.data_dir ~/data/my-images
    repro data prepare --source imagenet  # the hub's ILSVRC/imagenet-1k (needs a token)
    repro data info                       # every prepared dataset: where, size, splits
    repro data info --source folder --data.data_dir ~/data/my-images   # this one's status

``prepare`` builds the config's ``ImageDataModule`` (``--data.KEY VALUE`` overrides its settings, as for
``fit``), walks and fingerprints the source (always: a file rewritten in place is noticed here), prepares it
if it is new or changed (all cores, progress bar), decodes what it will hold in memory, and prints the prepared
directory. Run it where the source is readable (a login node, a machine with network and a hub token); a
training job then opens the prepared data in seconds, with no network and no token, from the same cache
(``--data.cache_dir`` or ``HF_DATASETS_CACHE``) or from a copy (``--data.prepared <directory>``).
Before any work ``prepare`` checks that the cache directory can be written (if not: one ``error:`` line naming it,
exit 2) and removes the temporary directories of earlier preparations whose process no longer runs on this host
(killed outright), one line each; ``info`` lists every such temporary directory with its owner.
Errors (an undecodable file, a gated dataset without a token, no network) are printed in one line; exit 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from reproductions.run.errors import ReproError, UsageError, one_line, yaml_syntax_message

DATA_CLASS = "datamodules.images.ImageDataModule"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="repro data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("prepare", "prepare the data of a config or source once (all cores), print where it is"),
                       ("info", "show the prepared datasets (where, size on disk, splits), or one source's status")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config", help="an experiment config: its data section is the starting point")
        p.add_argument("--source", help="the image source (digits, fashion_mnist, cifar10, folder, imagenet, owner/name)")
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.epilog = "Any --data.KEY VALUE sets that ImageDataModule setting (e.g. --data.data_dir, --data.cache_dir)."
    return parser


def data_settings(config: str | None, source: str | None, extra: list[str]) -> dict[str, Any]:
    """The ImageDataModule keywords: the config's ``data.init_args``, then ``--source``, then ``--data.KEY VALUE``."""
    settings: dict[str, Any] = {}
    if config:
        try:
            data = (yaml.safe_load(Path(config).read_text()) or {}).get("data") or {}
        except yaml.MarkedYAMLError as e:
            raise UsageError(yaml_syntax_message(e, [config]) or str(e)) from e
        if data.get("class_path", DATA_CLASS) != DATA_CLASS:
            raise ValueError(f"{config}: data is {data.get('class_path')}; `data` prepares {DATA_CLASS} only")
        settings.update(data.get("init_args") or {})
    if source:
        settings["source"] = source
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--data."):
            raise ValueError(f"unrecognised argument {arg!r}: use --data.KEY VALUE (e.g. --data.data_dir DIR)")
        key, eq, value = arg[len("--data."):].partition("=")
        if key.startswith("init_args."):
            key = key[len("init_args."):]
        if not eq:
            if i + 1 >= len(extra):
                raise ValueError(f"{arg} needs a value")
            value = extra[i + 1]
            i += 1
        settings[key] = yaml.safe_load(value) if value != "" else None
        i += 1
    return settings


def _cache(settings: dict[str, Any]) -> tuple[Path, str]:
    """The cache root of ``settings`` and what chose it (for the message when it cannot be written)."""
    import os

    from datamodules.images.cache import cache_root

    root = cache_root(settings.get("cache_dir"))
    if settings.get("cache_dir"):
        return root, "(from --data.cache_dir)"
    return root, "(from HF_DATASETS_CACHE)" if os.environ.get("HF_DATASETS_CACHE") else "(the datasets default)"


def prepare(settings: dict[str, Any], as_json: bool) -> dict[str, Any]:
    from datamodules.images import ImageDataModule, open_prepared
    from datamodules.images.workspace import CacheNotWritableError, check_writable, remove_stale

    start = time.perf_counter()
    dm = ImageDataModule(**settings)
    root, origin = _cache(settings)
    try:
        if settings.get("prepared") is None:  # a prepared directory given directly: the cache is not written
            check_writable(root, origin)
    except CacheNotWritableError as err:
        raise UsageError(str(err)) from None
    removed = remove_stale(root, say=lambda line: print(line, flush=True))
    data = dm.prepare(refresh=True)
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {"source": dm.source, "origin": data.origin, "seconds": round(seconds, 1),
                           "in_memory": dm.in_memory, "prepared": dm.prepared_path,
                           "removed_leftovers": [r.as_dict() for r in removed]}  # fmt: skip
    if dm.prepared_path:
        out.update(describe(open_prepared(dm.prepared_path)))
    else:
        out["splits"] = {"train": len(data.train), **({"test": len(data.test)} if data.test is not None else {})}
    if not as_json:
        print(f"prepared {dm.source} ({data.origin}) in {seconds:.1f} s")
        if dm.prepared_path:
            print(f"  {dm.prepared_path}")
            print(f"  {_summary(out)}")
            print(f"  train on it: --data.source {dm.source}" + (f" --data.data_dir {dm.data_dir}" if dm.data_dir else "")
                  + f"   (or, copied elsewhere: --data.prepared <copy of {Path(dm.prepared_path).name}>)")
        else:
            print(f"  {data.origin}: uint8 arrays in the datasets cache, splits {out['splits']}")
    return out


def describe(prepared) -> dict[str, Any]:
    """What ``data info`` shows of one prepared dataset."""
    from datamodules.images.workspace import directory_bytes

    manifest = prepared.manifest
    splits = {name: s["rows"] for name, s in manifest["splits"].items()}
    referenced = sum(s["bytes"] for s in manifest["splits"].values() if manifest["kind"] == "hub")
    decoded = {d.name: directory_bytes(d) for d in sorted(prepared.path.glob("decoded-*")) if d.is_dir()}
    return {
        "path": str(prepared.path), "kind": manifest["kind"], "source": manifest["source"],
        "origin": manifest["origin"], "created": manifest.get("created"), "splits": splits,
        "classes": len(manifest.get("class_names") or []) or None, "skipped": len(prepared.skipped),
        "bytes": directory_bytes(prepared.path) - sum(decoded.values()), "hub_cache_bytes": referenced,
        "decoded": decoded, "prepare_seconds": manifest.get("prepare_seconds"), "images": manifest.get("images"),
    }  # fmt: skip


def _summary(d: dict[str, Any]) -> str:
    from datamodules.images.workspace import human_bytes

    splits = ", ".join(f"{k} {v:,}" for k, v in d["splits"].items())
    size = human_bytes(d["bytes"])
    if d.get("hub_cache_bytes"):
        size += f" here + {human_bytes(d['hub_cache_bytes'])} referenced in the hub cache"
    decoded = "".join(f"; {k} {human_bytes(v)}" for k, v in d.get("decoded", {}).items())
    classes = f", {d['classes']} classes" if d.get("classes") else ""
    skipped = f", {d['skipped']} undecodable files skipped" if d.get("skipped") else ""
    return f"{splits}{classes}; {size}{decoded}{skipped}"


def info(settings: dict[str, Any], as_json: bool) -> dict[str, Any]:
    from datamodules.images.cache import cache_root
    from datamodules.images.prepared import list_prepared, prepared_root, read_index
    from datamodules.images.workspace import find_leftovers

    root = cache_root(settings.get("cache_dir"))
    out: dict[str, Any] = {"cache_root": str(root), "prepared_root": str(prepared_root(root))}
    if settings.get("source") or settings.get("data_dir"):
        out["status"] = _status(settings, root, read_index)
    out["datasets"] = [describe(p) for p in list_prepared(root)]
    arrays = sorted(d for d in (root / "attention-repro").glob("*-*") if (d / "dataset_dict.json").is_file())
    out["arrays"] = [{"path": str(d), "bytes": sum(p.stat().st_size for p in d.rglob("*") if p.is_file())}
                     for d in arrays]  # fmt: skip
    leftovers = find_leftovers(root)
    out["leftovers"] = [left.as_dict() for left in leftovers]
    if not as_json:
        from datamodules.images.workspace import human_bytes

        print(f"prepared datasets under {out['prepared_root']}:")
        for d in out["datasets"]:
            print(f"  {Path(d['path']).name}  [{d['kind']} {d['source']}: {d['origin']}]  created {d['created']}")
            print(f"      {_summary(d)}")
        if not out["datasets"]:
            print("  (none)")
        for d in out["arrays"]:
            print(f"  {Path(d['path']).name}  [uint8 arrays]  {human_bytes(d['bytes'])}")
        if leftovers:
            print("temporary directories of preparations (interrupted, or still running):")
            for left in leftovers:
                print(f"  {left.line()}")
        if "status" in out:
            print(out["status"]["line"])
    return out


def _status(settings: dict[str, Any], root: Path, read_index) -> dict[str, Any]:
    """Whether the source named by ``settings`` is prepared here (no walk, no network)."""
    from datamodules.images.prepared import prepared_root

    source, data_dir = settings.get("source", "folder"), settings.get("data_dir")
    if data_dir is not None and source in ("folder", "imagenet"):
        identity = f"folder:{Path(data_dir).expanduser().resolve()}"
    elif source == "imagenet":
        identity = f"hub:ILSVRC/imagenet-1k:{settings.get('image_column') or 'image'}:validation"
    else:
        name = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}.get(source, source)
        column = settings.get("image_column") or {"cifar10": "img", "cifar100": "img"}.get(source)
        identity = f"hub:{name}:{column}:None"
    entry = read_index(root, identity)
    if entry is None:
        return {"prepared": None, "line": f"{source} {data_dir or ''}: not prepared in {root}; run `python -m "
                "reproductions data prepare` with the same settings"}  # fmt: skip
    path = prepared_root(root) / entry["prepared"]
    return {"prepared": str(path), "line": f"{source} {data_dir or ''}: prepared in {path}"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = build_parser().parse_known_args(argv)
    try:
        settings = data_settings(args.config, args.source, extra)
        result = (prepare if args.command == "prepare" else info)(settings, args.json)
    except ReproError:  # a usage error we name ourselves: the one `error:` line, exit 2
        raise
    except (OSError, ValueError, ImportError) as err:  # undecodable files, gated or unreachable hub, bad settings
        # our messages name the file or setting and what to do: the one ``error:`` line, as every command
        print(f"error: {one_line(str(err) or type(err).__name__, limit=10_000)}", file=sys.stderr)
        return 1
    if args.json:
        from utils.atomic import json_text

        print(json_text(result), end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
