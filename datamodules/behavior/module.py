"""``BehaviorDataModule``: a source's samples, cached, served as model-ready dict batches.

The stages it runs (each in its own module of this package): ``sources.py`` picks the source's
pipeline (reader, split rule, samples), ``cache.py`` stores the preprocessed splits on disk
and loads them back, and this module serves them.

Evaluation protocol
-------------------
Every real source is split the same way, by ``split`` (``splits.py``): ``user_fraction``
(default) gives each user with enough events the last ``test_fraction`` of them as test and the
``val_fraction`` before as validation, at least ``min_split_events`` each, so most evaluated
users have impressions of both labels and GAUC is defined for them (``CTRModule`` logs how many
users and impressions it covers); ``leave_one_out`` (the last event test, the one before
validation) and ``last_days`` (Taobao's last day test) are kept as options. ``history`` picks
what the sequence holds (every previous event, or only the positives) and
``negatives_per_positive`` adds sampled negatives (None: the source's default). The synthetic
source keeps its random split and ignores all of these. ``describe()`` records them.

Batches and devices
-------------------
``batch_size`` is the global batch; ``setup`` splits it over ``trainer.world_size`` processes
(``per_device_batch_size``). Batches are dicts: ``user`` (B,), ``user_features`` (B, P),
``target_item`` (B,), ``target_category`` (B,), ``hist_items`` / ``hist_categories`` /
``hist_positions`` (B, L) long, ``hist_mask`` (B, L) bool, ``label`` (B,) float. After
``setup`` (or on first access) ``feature_sizes`` gives what the nets need.
The training order is a function of (seed, epoch) alone, split across the processes by
``datamodules.sampler``, whose loader carries its position in the checkpoint: a run resumed in the
middle of an epoch serves the rest of that epoch's batches, as an uninterrupted run would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.behavior.cache import (
    behavior_cache_root,
    entry_key,
    file_stats,
    is_complete,
    load_entry,
    save_entry,
    split_columns,
    to_hf_splits,
)
from datamodules.behavior.readers import TAOBAO_TIME_WINDOW
from utils.choices import check_annotated_choices
from datamodules.behavior.samples import HistoryKind, PadSide, PositionScheme, bucketize_time_delta
from datamodules.behavior.sources import BehaviorSource, SourceName, get_source
from datamodules.behavior.splits import SPLITS, SplitName, SplitRuleName, split_summary
from datamodules.sampler import ResumableLoader, ResumableSampler, run_seed
from models.ctr_batch import PAD, PAD_BUCKET, ZERO_DELTA_BUCKET

#: batch keys and the stored column each comes from (``hist_mask`` is hist_items != 0)
BATCH_COLUMNS = ("user", "user_features", "target_item", "target_category", "hist_items",
                 "hist_categories", "hist_positions", "label")
#: hyperparameters that change how the data are served, not the samples (never in the cache key)
SERVING_PARAMS = ("cache_dir", "use_cache", "batch_size", "eval_batch_size", "num_workers", "pin_memory", "data_dir")


class BehaviorDataModule(LightningDataModule):
    """CTR samples with behaviour sequences from one of ``sources.SOURCES`` (see the package docstring).

    Args:
        source: ``synthetic`` | ``movielens_1m`` | ``movielens_csv`` | ``taobao_user_behavior`` |
            ``amazon_electronics``.
        data_dir: folder with the raw files (real sources); never committed to the repository.
        cache_dir: where preprocessed splits are cached; default ``$BEHAVIOR_CACHE_DIR`` or
            ``~/.cache/bst_behavior``.
        use_cache: read / write the cache (off: preprocess in memory every time).
        seq_len: behaviour sequence length L (the paper: 20).
        pad_side: ``left`` (the newest item last) | ``right``.
        min_history: drop samples with fewer history items (real sources; for ``synthetic`` the
            smallest generated history length).
        history: what a real source's sequence holds: ``all`` previous events of the user
            (MovieLens: every rated movie, whatever the rating) | ``positive``: only the previous
            positives (label 1). The same for Taobao and Amazon, whose events are all positives.
        n_position_buckets: position-feature vocabulary, padding bucket 0 included.
        position_scheme: ``log`` (default) | ``linear`` (see ``samples.bucketize_time_delta``).
        position_time_unit: seconds per unit of the bucketing (default 60: minutes).
        position_log_base: base of the log buckets.
        batch_size: the global batch size, split over the processes.
        eval_batch_size: global batch for val/test/predict (default: ``batch_size``).
        num_workers: DataLoader workers per process.
        pin_memory: pin host memory (useful on GPUs).
        seed: seeds the synthetic world, the split, negative sampling and user subsampling.
        split: the real sources' evaluation protocol: ``user_fraction`` (per user the last
            ``test_fraction`` of the events test, the ``val_fraction`` before them validation) |
            ``leave_one_out`` (per user the last event test, the one before validation) |
            ``last_days`` (the last day test, the day before validation, in
            UTC+``utc_offset_hours``). The synthetic source ignores it (random split).
        test_fraction, val_fraction: ``user_fraction``'s shares of each user's events.
        min_split_events: ``user_fraction``'s least test and validation events per user; users
            with fewer than 2 * min_split_events + 1 events (more, with large fractions) are
            all train.
        synthetic_users, synthetic_items, synthetic_categories, synthetic_samples: sizes of the
            synthetic world.
        synthetic_val_fraction, synthetic_test_fraction: random split of the synthetic samples.
        positive_rating: MovieLens label = rating >= this.
        negatives_per_positive: sampled negatives (label 0, items the user has no event with)
            per positive; None: the source's default, 1 for Taobao and Amazon (all events are
            positives), 0 for MovieLens (the low ratings are the negatives).
        max_users: keep a seeded random subset of this many users (real sources).
        taobao_time_window: [start, end) unix seconds of the Taobao clicks kept (None: all).
        utc_offset_hours: the time zone of Taobao's day boundaries (UTC+8).

    The closed choices are ``Literal`` types: the command line rejects another value while
    parsing and lists the choices in ``--help``; a Python caller gets the same ValueError here.
    """

    def __init__(
        self,
        source: SourceName = "synthetic",
        data_dir: str | None = None,
        cache_dir: str | None = None,
        use_cache: bool = True,
        seq_len: int = 20,
        pad_side: PadSide = "left",
        min_history: int = 1,
        history: HistoryKind = "all",
        n_position_buckets: int = 24,
        position_scheme: PositionScheme = "log",
        position_time_unit: float = 60.0,
        position_log_base: float = 2.0,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        split: SplitRuleName = "user_fraction",
        test_fraction: float = 0.1,
        val_fraction: float = 0.1,
        min_split_events: int = 2,
        synthetic_users: int = 2000,
        synthetic_items: int = 2000,
        synthetic_categories: int = 20,
        synthetic_samples: int = 100_000,
        synthetic_val_fraction: float = 0.1,
        synthetic_test_fraction: float = 0.1,
        positive_rating: int = 4,
        negatives_per_positive: int | None = None,
        max_users: int | None = None,
        taobao_time_window: tuple[int, int] | None = TAOBAO_TIME_WINDOW,
        utc_offset_hours: float = 8.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_annotated_choices(BehaviorDataModule.__init__, self.hparams)
        _check_arguments(self.hparams)
        self._source = get_source(source)
        _check_source_arguments(self._source, self.hparams)
        if self._source.files is not None and data_dir is None:
            self._source.files.require(data_dir)  # says where to download it
        self.source = source
        self.data_dir = data_dir
        self.seq_len = seq_len
        self.pad_side = pad_side
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.per_device_batch_size: int | None = None
        self.per_device_eval_batch_size: int | None = None
        self.cache_status: str | None = None  #: "built", "loaded" or "in_memory" after preparation
        self.cache_path: Path | None = None
        self._meta: dict | None = None
        self._splits: dict | None = None  # HF datasets per split
        self._tensors: dict[str, _Batches] = {}

    # ------------------------------------------------------------------ positions
    def bucketize(self, delta: np.ndarray) -> np.ndarray:
        """This module's position buckets of time deltas in seconds (see ``samples.bucketize_time_delta``)."""
        h = self.hparams
        return bucketize_time_delta(delta, n_buckets=h.n_position_buckets, scheme=h.position_scheme,
                                    time_unit=h.position_time_unit, log_base=h.position_log_base)

    # ------------------------------------------------------------------ caching
    def preprocessing_params(self) -> dict:
        """The hyperparameters that decide this source's samples (what the cache key hashes)."""
        h = {k: v for k, v in self.hparams.items() if k not in SERVING_PARAMS}
        h = {k: v for k, v in h.items() if not k.startswith(self._source.cache_ignores)}
        # as JSON holds it; a source that ignores the window records None (the keys always have)
        h["taobao_time_window"] = list(h["taobao_time_window"]) if h.get("taobao_time_window") else None
        if "negatives_per_positive" in h:  # None and the default it stands for make the same samples
            h["negatives_per_positive"] = self._source.negatives_per_positive(h)
        return h

    def cache_key(self) -> str:
        """Hash of the cache version, the preprocessing parameters and the source files' size and mtime."""
        files = []
        if self._source.files is not None:
            folder = self._source.files.require(self.data_dir)
            files = file_stats(folder, self._source.files.present(folder))
        return entry_key(self.preprocessing_params(), files)

    def _ensure_prepared(self) -> None:
        """Load the cached splits, or preprocess (and cache) them; idempotent."""
        if self._splits is not None:
            return
        if not self.hparams.use_cache:
            columns, split, meta = self.preprocess()
            self._splits, self._meta = to_hf_splits(columns, split), meta
            self.cache_status = "in_memory"
            return
        path = behavior_cache_root(self.hparams.cache_dir) / f"{self.source}-{self.cache_key()}"
        self.cache_path = path
        if is_complete(path):
            self.cache_status = "loaded"
        else:
            columns, split, meta = self.preprocess()
            save_entry(path, to_hf_splits(columns, split), meta)
            self.cache_status = "built"
        self._splits, self._meta = load_entry(path)

    def prepare_data(self) -> None:
        """Preprocess into the cache once (Lightning calls this on one process per node)."""
        self._ensure_prepared()

    # ------------------------------------------------------------------ preprocessing
    def preprocess(self) -> tuple[dict[str, np.ndarray], np.ndarray, dict]:
        """Read the raw source and build every sample: (columns, split codes, meta)."""
        h = self.hparams
        start = time.perf_counter()
        prepared = self._source.build(self.data_dir, h, self.bucketize)
        columns, split = prepared.columns, prepared.split
        if len(columns["label"]) == 0:
            raise ValueError(f"source={self.source!r} produced no samples (min_history={h.min_history}?)")
        sizes = {**prepared.sizes, "n_position_buckets": h.n_position_buckets, "seq_len": h.seq_len}
        meta = {
            "source": self.source,
            **prepared.meta,  # "ceiling" (generated) or "raw" (read)
            "feature_sizes": sizes,
            "n_profile_fields": len(sizes.get("profile_sizes", [])),
            "preprocess_seconds": round(time.perf_counter() - start, 3),
            "params": self.preprocessing_params(),
            "splits": split_summary(columns["label"], columns["user"], split),
        }
        return columns, split, meta

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        for name, value in (("batch_size", self.batch_size), ("eval_batch_size", self.eval_batch_size)):
            if value % world_size:
                raise ValueError(
                    f"{name}={value} is the global batch and must be divisible by the {world_size} processes"
                )
        self.per_device_batch_size = self.batch_size // world_size
        self.per_device_eval_batch_size = self.eval_batch_size // world_size
        self._ensure_prepared()
        for name in SPLITS:
            if name not in self._tensors:
                self._tensors[name] = self._batches(name)

    def _batches(self, split: str) -> _Batches:
        return _Batches(split_columns(self._splits[split], BATCH_COLUMNS, self.n_profile_fields))

    def _loader(self, split: str, train: bool) -> DataLoader:
        if split not in self._tensors:
            raise RuntimeError("call setup() before asking for a DataLoader")
        workers = self.hparams.num_workers
        dataset = self._tensors[split]
        options = dict(num_workers=workers, persistent_workers=workers > 0, pin_memory=self.hparams.pin_memory,
                       collate_fn=_pass_through)  # fmt: skip
        if not train:
            return DataLoader(dataset, batch_size=self.per_device_eval_batch_size, shuffle=False, **options)
        # the order a function of (seed, epoch), split across processes, resumable mid-epoch
        trainer = self.trainer
        world_size = trainer.world_size if trainer is not None else 1
        rank = getattr(trainer, "global_rank", 0) if trainer is not None else 0
        sampler = ResumableSampler(dataset, seed=run_seed(), num_replicas=world_size, rank=rank)
        return ResumableLoader(dataset, batch_size=self.per_device_batch_size, sampler=sampler,
                               drop_last=len(dataset) > self.per_device_batch_size, **options)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    # ------------------------------------------------------------------ what the nets and reports need
    @property
    def feature_sizes(self) -> dict:
        """Vocabulary sizes (id 0 included) and lengths, by the nets' keyword names:
        ``n_users``, ``n_items``, ``n_categories``, ``profile_sizes`` (if the source has a
        profile), ``n_position_buckets``, ``seq_len``. Prepares the data on first access."""
        self._ensure_prepared()
        return dict(self._meta["feature_sizes"])

    @property
    def n_profile_fields(self) -> int:
        self._ensure_prepared()
        return int(self._meta["n_profile_fields"])

    @property
    def ceiling(self) -> dict | None:
        """Synthetic only: AUC / GAUC / logloss of the true click probabilities per split."""
        self._ensure_prepared()
        return self._meta.get("ceiling")

    @property
    def ceiling_auc(self) -> float | None:
        """Synthetic only: the test AUC of the true click probabilities (the best reachable)."""
        return None if self.ceiling is None else self.ceiling["test_auc"]

    def split_dataset(self, split: SplitName):
        """The preprocessed HF dataset of a split (all columns, incl. ``target_time``, ``hist_times``)."""
        check_annotated_choices(BehaviorDataModule.split_dataset, {"split": split})
        self._ensure_prepared()
        return self._splits[split]

    def example_batch(self, n: int = 1) -> dict[str, torch.Tensor]:
        """The first ``n`` training samples as a batch (for FLOP counting and smoke checks)."""
        if "train" not in self._tensors:
            self._ensure_prepared()
            self._tensors["train"] = self._batches("train")
        data = self._tensors["train"]
        return data.__getitems__(list(range(min(n, len(data)))))

    def describe(self) -> dict:
        """What the results file records about the data."""
        self._ensure_prepared()
        h = self.hparams
        out = {
            "class": type(self).__name__,
            "source": self.source,
            "data_dir": self.data_dir,
            "seq_len": h.seq_len,
            "pad_side": h.pad_side,
            "min_history": h.min_history,
            "split": self._source.describe_split(h),
            "position": {"scheme": h.position_scheme, "n_buckets": h.n_position_buckets,
                         "time_unit_s": h.position_time_unit, "log_base": h.position_log_base,
                         "padding_bucket": PAD_BUCKET, "zero_delta_bucket": ZERO_DELTA_BUCKET},
            "feature_sizes": self._meta["feature_sizes"],
            "splits": self._meta["splits"],
            "ceiling": self._meta.get("ceiling"),
            "batch_size": self.batch_size,
            "per_device_batch_size": self.per_device_batch_size,
            "seed": h.seed,
            "cache": {"path": None if self.cache_path is None else str(self.cache_path), "status": self.cache_status},
            "preprocess_seconds": self._meta.get("preprocess_seconds"),
        }
        if self._source.files is None:  # generated
            out[self.source] = {k: h[k] for k in h if k.startswith(f"{self.source}_")}
        else:
            out["raw"] = self._meta.get("raw")
            out["history"] = h.history
            out["negatives_per_positive"] = self._source.negatives_per_positive(h)
            out.update({k: h[k] for k in self._source.described})
        return out


# =========================================================================== batches
class _Batches(Dataset):
    """In-memory columns served a whole batch at a time (``__getitems__``), as model-ready dicts."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in columns.items()}
        self.length = len(self.columns["label"])

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        batch = {k: v[idx] for k, v in self.columns.items()}
        out = {k: v.long() for k, v in batch.items() if k != "label"}
        out["label"] = batch["label"].float()
        out["hist_mask"] = out["hist_items"] != PAD
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


def _pass_through(batch):
    """collate_fn for datasets that already return whole batches."""
    return batch


# =========================================================================== argument checks
def _check_arguments(h: Mapping) -> None:
    """What a type cannot say: positive sizes, ranges, consistent synthetic world sizes."""
    _positive(seq_len=h["seq_len"], batch_size=h["batch_size"], position_time_unit=h["position_time_unit"],
              synthetic_users=h["synthetic_users"], synthetic_items=h["synthetic_items"],
              synthetic_categories=h["synthetic_categories"], synthetic_samples=h["synthetic_samples"])
    negatives = h["negatives_per_positive"]
    if negatives is not None and (not isinstance(negatives, int) or isinstance(negatives, bool) or negatives < 0):
        raise ValueError(f"negatives_per_positive={negatives!r} must be None (the source's default) or an int >= 0")
    _check_split_arguments(h)
    for name in ("eval_batch_size", "max_users"):
        if h[name] is not None:
            _positive(**{name: h[name]})
    n_buckets = h["n_position_buckets"]
    if not isinstance(n_buckets, int) or n_buckets < 3:
        raise ValueError(f"n_position_buckets={n_buckets!r} must be an int >= 3 (0 padding, 1 delta 0, more)")
    if h["position_scheme"] == "log" and h["position_log_base"] <= 1:
        raise ValueError(f"position_log_base={h['position_log_base']!r} must be > 1")
    if not 0 <= h["min_history"] <= h["seq_len"]:
        raise ValueError(f"min_history={h['min_history']!r} must be in [0, seq_len={h['seq_len']}]")
    if h["num_workers"] < 0:
        raise ValueError(f"num_workers={h['num_workers']!r} must be >= 0")
    items, categories = h["synthetic_items"], h["synthetic_categories"]
    if items < categories:
        raise ValueError(
            f"synthetic_items={items} must be >= synthetic_categories={categories} (every category needs an item)"
        )
    if categories < 2:
        raise ValueError(f"synthetic_categories={categories!r} must be >= 2")
    for name in ("synthetic_val_fraction", "synthetic_test_fraction"):
        if not 0.0 < h[name] < 1.0:
            raise ValueError(f"{name}={h[name]!r} must be in (0, 1)")
    if h["synthetic_val_fraction"] + h["synthetic_test_fraction"] >= 1.0:
        raise ValueError("synthetic_val_fraction + synthetic_test_fraction must be < 1")
    window = h["taobao_time_window"]
    if window is not None and window[0] >= window[1]:
        raise ValueError(f"taobao_time_window={list(window)!r} must be [start, end) with start < end")


def _check_split_arguments(h: Mapping) -> None:
    """``user_fraction``'s shares in (0, 1) with room for train events, and its minimum an int >= 1."""
    for name in ("test_fraction", "val_fraction"):
        if not isinstance(h[name], (int, float)) or not 0.0 < h[name] < 1.0:
            raise ValueError(f"{name}={h[name]!r} must be in (0, 1)")
    if h["test_fraction"] + h["val_fraction"] >= 1.0:
        raise ValueError(
            f"test_fraction + val_fraction = {h['test_fraction'] + h['val_fraction']!r} must be < 1 "
            "(the rest of each user's events is train)"
        )
    m = h["min_split_events"]
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"min_split_events={m!r} must be an int >= 1 (the least test and validation events per user)")


def _check_source_arguments(source: BehaviorSource, h: Mapping) -> None:
    """What depends on the source: a source whose events are all positives needs sampled negatives."""
    if source.default_negatives and source.negatives_per_positive(h) == 0:
        raise ValueError(
            f"negatives_per_positive=0 leaves source={source.name!r} with positives only (its events are all "
            f"positives, so AUC is undefined): use None (its default, {source.default_negatives}) or an int >= 1"
        )


def _positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name}={value!r} must be positive")
