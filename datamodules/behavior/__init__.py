"""CTR data with user behaviour sequences for the BST reproduction (Chen et al. 2019).

``BehaviorDataModule(source=...)`` turns one of five sources into samples
(user, profile, target item, its category, the user's previous ``seq_len`` items with their
categories and position buckets, click label), split into train / val / test, cached on disk
as HF ``datasets``, and served as dict batches (keys and shapes in ``models/ctr.py``).

One module per stage:

``sources.py``
    The registry of sources (``synthetic``, ``movielens_1m``, ``movielens_csv``,
    ``taobao_user_behavior``, ``amazon_electronics``): each entry names its reader, its raw files
    and its split rule; what each source holds and how it becomes samples is documented there.
``readers.py``
    The raw-file readers of the real sources, with ``MalformedLineError`` (file, line, format)
    and ``DatasetMissingError`` (what is missing, where to download it).
``synthetic.py``
    The seeded synthetic world and its ceiling (the true probabilities' AUC / GAUC / log loss).
``samples.py``
    Events to samples: history windows (all previous events or the positives), padding, sampled
    negatives, position buckets.
``splits.py``
    The split rules and the seeded user subset: the real sources' evaluation protocol
    (``split``: the last fraction of each user's events, default; the last event per user; the
    last days) and the synthetic random cut.
``metrics.py``
    AUC / GAUC / log loss in numpy, for the ceiling (why beside ``lightning_modules.metrics``: there).
``cache.py``
    The keyed on-disk cache of preprocessed splits, written atomically.
``module.py``
    ``BehaviorDataModule``: the Lightning side (arguments, caching, loaders, ``describe``).

The names below are the public API (``datamodules.behavior.BehaviorDataModule`` is the
``class_path`` of the BST configs).
"""

from datamodules.behavior.cache import CACHE_VERSION
from datamodules.behavior.metrics import auc, gauc, logloss
from datamodules.behavior.module import BATCH_COLUMNS, BehaviorDataModule
from datamodules.behavior.readers import (
    FORMATS,
    TAOBAO_BEHAVIORS,
    TAOBAO_TIME_WINDOW,
    DatasetMissingError,
    MalformedLineError,
    RawFiles,
    read_amazon_electronics,
    read_movielens_1m,
    read_movielens_csv,
    read_user_behavior,
)
from datamodules.behavior.samples import (
    HISTORY_KINDS,
    PAD_SIDES,
    POSITION_SCHEMES,
    HistoryKind,
    PadSide,
    PositionScheme,
    build_samples,
    bucketize_time_delta,
    history_index,
    sample_negatives,
)
from datamodules.behavior.sources import DOWNLOAD, REQUIRED_FILES, SOURCES, BehaviorSource, SourceName, get_source
from datamodules.behavior.splits import (
    SPLIT_RULE_NAMES,
    SPLITS,
    SplitName,
    SplitRuleName,
    day_split,
    per_user_fraction_split,
    per_user_last_split,
    random_split,
    subsample_users,
)
from datamodules.behavior.synthetic import SYNTHETIC_PROFILE_CARDINALITIES, generate_synthetic, synthetic_ceiling

__all__ = [
    "BATCH_COLUMNS", "CACHE_VERSION", "DOWNLOAD", "FORMATS", "HISTORY_KINDS", "PAD_SIDES", "POSITION_SCHEMES",
    "REQUIRED_FILES", "SOURCES", "SPLITS", "SPLIT_RULE_NAMES", "SYNTHETIC_PROFILE_CARDINALITIES", "TAOBAO_BEHAVIORS",
    "TAOBAO_TIME_WINDOW",
    "BehaviorDataModule", "DatasetMissingError", "HistoryKind", "MalformedLineError", "PadSide", "PositionScheme",
    "RawFiles", "BehaviorSource", "SourceName", "SplitName", "SplitRuleName",
    "auc", "build_samples", "bucketize_time_delta", "day_split", "gauc", "generate_synthetic", "get_source",
    "history_index", "logloss", "per_user_fraction_split", "per_user_last_split", "random_split",
    "read_amazon_electronics", "read_movielens_1m", "read_movielens_csv", "read_user_behavior", "sample_negatives",
    "subsample_users", "synthetic_ceiling",
]
