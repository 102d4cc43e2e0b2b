"""ImageClassifier with Mixup/CutMix targets: (B, K) class probabilities train; accuracy uses their argmax."""

import torch
from torch import nn

from lightning_modules.image_classifier import ImageClassifier
from models.vit import ViT


def test_soft_targets_give_the_cross_entropy_of_probabilities_and_argmax_accuracy():
    torch.manual_seed(0)
    net = ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=16, depth=1, num_heads=2)
    module = ImageClassifier(net, label_smoothing=0.1)
    images = torch.randn(6, 1, 8, 8)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    mixed = 0.7 * nn.functional.one_hot(labels, 4).float() + 0.3 * nn.functional.one_hot(labels.flip(0), 4).float()
    loss = module._shared_step((images, mixed), module.train_acc)
    logits = net(images)
    assert torch.allclose(loss, nn.CrossEntropyLoss(label_smoothing=0.1)(logits, mixed), atol=1e-6)
    expected = (logits.argmax(-1) == mixed.argmax(-1)).float().mean()
    assert torch.allclose(module.train_acc.compute(), expected)
    # one-hot float targets are the same loss as the int labels
    module.train_acc.reset()
    hard = module._shared_step((images, labels), module.train_acc)
    one_hot = module._shared_step((images, nn.functional.one_hot(labels, 4).float()), module.val_acc)
    assert torch.allclose(hard, one_hot, atol=1e-6)
