"""Linear few-shot evaluation of frozen representations (ViT paper, Sec. 4.1 "Metrics").

"Few-shot accuracies are obtained by solving a regularized least-squares regression problem
that maps the (frozen) representation of a subset of training images to {-1, 1}^K target
vectors. This formulation allows us to recover the exact solution in closed form."

The recipe is big_vision's few-shot evaluator (``evaluators/fewshot_lsr.py``), the code the
paper's authors use:
1. features = the pre-logit representation (``pre_logits``): for timm-style models
   ``forward_head(forward_features(x), pre_logits=True)``, i.e. the class token or the
   average of the patch tokens after the final LayerNorm for ``ViT``/``HybridViT``, the
   globally average-pooled last feature map for ``ResNet``.
2. k images per class are drawn (one seeded permutation per class and draw; the k-shot sets
   of one draw are nested: the 5-shot set contains the 1-shot set).
3. The k-shot features are standardised per dimension with their own mean and std (+1e-5),
   a constant feature ``bias_constant`` = 100 is appended (the bias, large so the penalty
   barely touches it), targets are 2 * one_hot - 1 in {-1, +1}^K.
4. W = argmin ||X W - Y||^2 + l2 ||W||^2 = (X^T X + l2 I)^-1 X^T Y (or, when there are fewer
   points than dimensions, X^T (X X^T + l2 I)^-1 Y: the same W), in float64; ``l2`` = 2^10 as
   big_vision's configs.
5. Held-out images are standardised with the k-shot statistics; prediction = argmax of X W;
   the metric is the accuracy, averaged over ``draws`` random draws of the k-shot sets.

``FewShotCallback`` logs ``val/fewshot_<k>`` during training (see its docstring for which
images it uses).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

BIAS_CONSTANT = 100.0
DEFAULT_L2 = 2.0**10
DEFAULT_SHOTS = (1, 5, 10, 25)


# ------------------------------------------------------------------------------ the solver


def ridge_regression(x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """Closed-form regularised least squares: W (D, K) minimising ||x W - y||^2 + l2 ||W||^2.

    x (N, D), y (N, K). Solves the smaller of the two equivalent systems, in float64:
    (x^T x + l2 I_D) W = x^T y when N >= D, else W = x^T alpha with (x x^T + l2 I_N) alpha = y.
    Needs ``l2 > 0`` (the systems are then positive definite).
    """
    if l2 <= 0:
        raise ValueError(f"l2={l2!r} must be positive")
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x must be (N, D) and y (N, K) with the same N, got {tuple(x.shape)} and {tuple(y.shape)}")
    x, y = x.double(), y.double()
    n, d = x.shape
    if n >= d:
        gram = x.T @ x + l2 * torch.eye(d, dtype=x.dtype, device=x.device)
        return torch.linalg.solve(gram, x.T @ y)
    gram = x @ x.T + l2 * torch.eye(n, dtype=x.dtype, device=x.device)
    return x.T @ torch.linalg.solve(gram, y)


@dataclass
class LinearFewShotClassifier:
    """The fitted probe: standardisation statistics of the k-shot features and the weights."""

    mean: torch.Tensor  # (1, D)
    std: torch.Tensor  # (1, D)
    weights: torch.Tensor  # (D + 1, K), the last row multiplies the bias feature
    bias_constant: float = BIAS_CONSTANT

    def design(self, features: torch.Tensor) -> torch.Tensor:
        """(N, D) features -> (N, D + 1): standardised, with the constant bias feature appended."""
        x = (features.double() - self.mean) / self.std
        return torch.cat([x, x.new_full((x.shape[0], 1), self.bias_constant)], dim=1)

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, K) regression outputs; their argmax is the predicted class."""
        return self.design(features) @ self.weights

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        return self.scores(features).argmax(dim=1)


def fit_linear_fewshot(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    *,
    l2: float = DEFAULT_L2,
    bias_constant: float = BIAS_CONSTANT,
) -> LinearFewShotClassifier:
    """Fit the paper's probe on k-shot features (N, D) with integer labels (N,) -> {-1,+1}^K."""
    x = features.detach().double().cpu()
    labels = torch.as_tensor(labels).long().cpu()
    mean = x.mean(dim=0, keepdim=True)
    std = x.std(dim=0, unbiased=False, keepdim=True) + 1e-5
    probe = LinearFewShotClassifier(mean, std, torch.empty(0), bias_constant)
    targets = 2.0 * nn.functional.one_hot(labels, num_classes).double() - 1.0
    probe.weights = ridge_regression(probe.design(x), targets, l2)
    return probe


def linear_fewshot_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    *,
    l2: float = DEFAULT_L2,
    bias_constant: float = BIAS_CONSTANT,
) -> float:
    """Accuracy on the held-out set of the probe fitted on the given (k-shot) training set."""
    probe = fit_linear_fewshot(train_features, train_labels, num_classes, l2=l2, bias_constant=bias_constant)
    predicted = probe.predict(test_features.detach().cpu())
    return float((predicted == torch.as_tensor(test_labels).long().cpu()).double().mean())


def draw_kshot(labels: np.ndarray | torch.Tensor, shots: Sequence[int], num_classes: int, seed: int) -> dict[int, np.ndarray]:
    """Positions of the k-shot sets of one draw: for each class a permutation of its members
    (seeded by ``seed``), the k-shot set takes its first k. Nested: the k-shot set is contained in
    every larger one of the same draw. Shots larger than the smallest class are left out."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    members = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    smallest = min(len(m) for m in members)
    return {k: np.concatenate([m[:k] for m in members]) for k in shots if k <= smallest}


@dataclass
class FewShotResult:
    """Per shot count k: the accuracy of each draw and their mean (``accuracy[k]``)."""

    per_draw: dict[int, list[float]] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)  # shots with too few images in some class

    @property
    def accuracy(self) -> dict[int, float]:
        return {k: float(np.mean(v)) for k, v in self.per_draw.items()}

    @property
    def std(self) -> dict[int, float]:
        return {k: float(np.std(v)) for k, v in self.per_draw.items()}


def _check_shots(shots: Iterable[int], draws: int) -> tuple[int, ...]:
    shots = tuple(shots)
    if not shots or any(not isinstance(k, int) or k < 1 for k in shots):
        raise ValueError(f"shots={shots!r} must be positive integers, e.g. {DEFAULT_SHOTS}")
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws={draws!r} must be a positive integer")
    return shots


def fewshot_evaluate(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    *,
    shots: Sequence[int] = DEFAULT_SHOTS,
    draws: int = 3,
    seed: int = 0,
    l2: float = DEFAULT_L2,
) -> FewShotResult:
    """The paper's metric from precomputed features: for each draw d (k-shot sets drawn with
    seed ``seed + d`` from the training features) and each k, the probe's accuracy on all test
    features. Shots some class cannot fill are reported in ``skipped``."""
    shots = _check_shots(shots, draws)
    result = FewShotResult()
    train_labels = torch.as_tensor(train_labels).long().cpu()
    for d in range(draws):
        sets = draw_kshot(train_labels.numpy(), shots, num_classes, seed + d)
        for k in shots:
            if k not in sets:
                if k not in result.skipped:
                    result.skipped.append(k)
                continue
            idx = torch.from_numpy(sets[k])
            acc = linear_fewshot_accuracy(
                train_features[idx], train_labels[idx], test_features, test_labels, num_classes, l2=l2
            )
            result.per_draw.setdefault(k, []).append(acc)
    return result


# ------------------------------------------------------------------------------ features


def pre_logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The frozen representation the probe reads: (B, C, H, W) -> (B, D).

    timm-style models (``ViT``, ``HybridViT``, ``ResNet``, timm's own):
    ``forward_head(forward_features(x), pre_logits=True)``, the pooled features before the
    classifier (the model's own pooling: class token or token average, global average pool).
    A LightningModule holding the model as ``net`` is unwrapped.
    """
    model = getattr(model, "net", model) if isinstance(model, LightningModule) else model
    if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
        raise TypeError(
            f"{type(model).__name__} has no forward_features/forward_head: pass a timm-style model "
            "(models.vit.ViT, models.hybrid.HybridViT, models.resnet.ResNet or a timm model)"
        )
    features = model.forward_head(model.forward_features(images), pre_logits=True)
    return features.flatten(1)


@torch.no_grad()
def extract_features(
    model: nn.Module,
    data: Dataset | DataLoader,
    *,
    batch_size: int = 256,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-logit features (N, D) float32 and labels (N,) of a dataset of (image, label) items or a
    loader of (images, labels) batches, on CPU. The model runs in eval mode (restored after)."""
    model_ = getattr(model, "net", model) if isinstance(model, LightningModule) else model
    if device is None:
        device = next((p.device for p in model_.parameters()), torch.device("cpu"))
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size, shuffle=False)
    was_training = model_.training
    model_.eval()
    feats, labels = [], []
    try:
        for images, targets in loader:
            feats.append(pre_logits(model_, images.to(device)).float().cpu())
            labels.append(torch.as_tensor(targets).long().cpu())
    finally:
        model_.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def _targets(dataset: Dataset) -> np.ndarray:
    """Labels of every item, without decoding images when the dataset exposes ``targets``."""
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return np.asarray(torch.as_tensor(targets).long())
    return np.asarray([int(dataset[i][1]) for i in range(len(dataset))])


def _without_augmentation(dataset: Dataset) -> Dataset:
    """A shallow copy whose ``transform`` is off (the k-shot images are read as evaluated)."""
    if getattr(dataset, "transform", None) is None:
        return dataset
    plain = copy.copy(dataset)
    plain.transform = None
    return plain


def fewshot_from_datasets(
    model: nn.Module,
    shot_dataset: Dataset,
    eval_dataset: Dataset,
    num_classes: int,
    *,
    shots: Sequence[int] = DEFAULT_SHOTS,
    draws: int = 3,
    seed: int = 0,
    l2: float = DEFAULT_L2,
    batch_size: int = 256,
    max_eval_samples: int | None = None,
    device: torch.device | str | None = None,
) -> FewShotResult:
    """The metric for a model on two datasets: k-shot sets drawn from ``shot_dataset`` (read
    without its augmentation; only the images some draw uses are embedded), accuracy on
    ``eval_dataset`` (its first ``max_eval_samples`` items, or all)."""
    shots = _check_shots(shots, draws)
    labels = _targets(shot_dataset)
    draw_sets = [draw_kshot(labels, shots, num_classes, seed + d) for d in range(draws)]
    needed = np.unique(np.concatenate([s for sets in draw_sets for s in sets.values()] or [np.zeros(0, int)]))
    eval_items = eval_dataset if max_eval_samples is None else Subset(eval_dataset, range(min(max_eval_samples, len(eval_dataset))))
    test_x, test_y = extract_features(model, eval_items, batch_size=batch_size, device=device)
    result = FewShotResult()
    if len(needed):
        shot_x, shot_y = extract_features(
            model, Subset(_without_augmentation(shot_dataset), needed.tolist()), batch_size=batch_size, device=device
        )
        position = {int(i): p for p, i in enumerate(needed)}
    for d, sets in enumerate(draw_sets):
        for k in shots:
            if k not in sets:
                if k not in result.skipped:
                    result.skipped.append(k)
                continue
            rows = torch.tensor([position[int(i)] for i in sets[k]])
            acc = linear_fewshot_accuracy(shot_x[rows], shot_y[rows], test_x, test_y, num_classes, l2=l2)
            result.per_draw.setdefault(k, []).append(acc)
    return result


# ------------------------------------------------------------------------------ callback


class FewShotCallback(Callback):
    """Log the linear few-shot accuracy ``val/fewshot_<k>`` while training, so a sweep can be
    read by it as the paper does (Fig. 3, 4, Table 8 use 5-shot ImageNet).

    Which images: the k-shot sets are drawn from the datamodule's TRAINING split (the images
    the model is trained on, read without augmentation; only the <= draws x K x max(shots)
    images some draw uses are embedded); the accuracy is measured on the VALIDATION split.
    So this is the linear separability of the learned representation on the training task,
    with k labels per class; it is not the paper's transfer setting (JFT features, ImageNet
    few-shot), which needs a second dataset.

    At ``test`` (e.g. the test after fit, on the best checkpoint) it logs ``test/fewshot_<k>``:
    the same k-shot draws from the training split, accuracy on the TEST split, so results.json
    holds the few-shot accuracy of the weights the test reports (the data-size study's metric).

    When: at the end of the fit's validation every ``every_n_epochs`` epochs (and in the last
    epoch; ``None``: never during fit), at every ``validate`` and ``test`` run, never during the
    sanity check. Each draw d uses seed ``seed + d`` (numpy generators: the
    training RNG streams are untouched, so runs with and without the callback train alike).
    In multi-device runs every process computes the same numbers on the full sets.

    Args:
        shots: k values; shots that a class of the training split cannot fill are skipped
            with a warning.
        draws: random draws of the k-shot sets averaged per k.
        every_n_epochs: evaluation period in epochs during fit; None: only at validate/test.
        l2: ridge penalty (big_vision: 2^10).
        seed: seed of the first draw.
        max_eval_samples: evaluate on the first this many validation images (None: all).
        batch_size: batch size of the feature extraction.
    """

    def __init__(
        self,
        shots: Sequence[int] = DEFAULT_SHOTS,
        draws: int = 3,
        every_n_epochs: int | None = 1,
        l2: float = DEFAULT_L2,
        seed: int = 0,
        max_eval_samples: int | None = None,
        batch_size: int = 256,
    ) -> None:
        self.shots = _check_shots(shots, draws)
        self.draws = draws
        if every_n_epochs is not None and (not isinstance(every_n_epochs, int) or every_n_epochs < 1):
            raise ValueError(f"every_n_epochs={every_n_epochs!r} must be a positive integer, or None (only at validate/test)")
        if l2 <= 0:
            raise ValueError(f"l2={l2!r} must be positive")
        self.every_n_epochs = every_n_epochs
        self.l2 = l2
        self.seed = seed
        self.max_eval_samples = max_eval_samples
        self.batch_size = batch_size
        self.last_result: FewShotResult | None = None
        self._warned: set[int] = set()

    @staticmethod
    def _datasets(trainer: Trainer, stage: str = "val") -> tuple[Dataset, Dataset, int]:
        """The training split (k-shot sets) and the ``stage`` split (``val`` or ``test``) evaluated."""
        dm = getattr(trainer, "datamodule", None)
        train = getattr(dm, "train_dataset", None)
        held_out = getattr(dm, f"{stage}_dataset", None)
        num_classes = getattr(dm, "num_classes", None)
        if train is None:
            train = getattr(trainer.train_dataloader, "dataset", None) if trainer.state.fn == "fit" else None
        if held_out is None:
            loaders = trainer.val_dataloaders if stage == "val" else trainer.test_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
            held_out = getattr(loader, "dataset", None)
        if train is None or held_out is None or len(held_out) == 0:
            split = "validation" if stage == "val" else "test"
            raise RuntimeError(
                f"FewShotCallback needs the training split and a {split} split (e.g. ImageDataModule"
                + (" with val_fraction > 0)" if stage == "val" else ", which holds its training split at test)")
            )
        if num_classes is None:
            num_classes = int(_targets(train).max()) + 1
        return train, held_out, int(num_classes)

    def _due(self, trainer: Trainer) -> bool:
        if self.every_n_epochs is None:
            return False
        epoch = trainer.current_epoch + 1
        last = trainer.max_epochs is not None and trainer.max_epochs > 0 and epoch >= trainer.max_epochs
        return epoch % self.every_n_epochs == 0 or last or bool(trainer.fast_dev_run)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.state.fn == "fit" and not self._due(trainer):
            return
        self._evaluate(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._evaluate(trainer, pl_module, "test")

    def _evaluate(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        train, held_out, num_classes = self._datasets(trainer, stage)
        net = getattr(pl_module, "net", pl_module)
        result = fewshot_from_datasets(
            net, train, held_out, num_classes, shots=self.shots, draws=self.draws, seed=self.seed, l2=self.l2,
            batch_size=self.batch_size, max_eval_samples=self.max_eval_samples, device=pl_module.device,
        )
        for k in result.skipped:
            if k not in self._warned:
                self._warned.add(k)
                warnings.warn(f"FewShotCallback: a class of the training split has fewer than {k} images; "
                              f"{stage}/fewshot_{k} is not logged", stacklevel=2)
        for k, acc in result.accuracy.items():
            # every process computed the same value: the mean over processes is that value
            pl_module.log(f"{stage}/fewshot_{k}", acc, on_step=False, on_epoch=True, sync_dist=True)
        self.last_result = result
