"""Trunks built from torchvision's ResNet/ResNeXt builders, edited to match the originals.

Module names stay torchvision's (`conv1`, `bn1`, `layerN.i.convK/bnK/downsample.*`), which
keeps the checkpoint key map a plain rename table (see checkpoints.py).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet
from torchvision.ops import FrozenBatchNorm2d


class Stem(nn.Module):
    """conv1 -> bn1 -> ReLU -> max-pool, plus the residual stages that follow."""

    def __init__(self, net: nn.Module, stages: tuple[str, ...]):
        super().__init__()
        self.conv1, self.bn1, self.maxpool = net.conv1, net.bn1, net.maxpool
        self.stage_names = stages
        for name in stages:
            setattr(self, name, getattr(net, name))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        outs = []
        for name in self.stage_names:
            x = getattr(self, name)(x)
            outs.append(x)
        return outs


def _stride_in_1x1(block: nn.Module) -> None:
    # MSRA/Caffe bottleneck: the stage's stride-2 sits in the first 1x1 conv.
    stride = block.conv2.stride
    block.conv1.stride, block.conv2.stride = stride, (1, 1)


RESNET101_BLOCKS = (3, 4, 23, 3)


def build_butd_trunk(blocks=RESNET101_BLOCKS, width_per_group: int = 64) -> tuple[Stem, nn.Sequential]:
    """BUTD ResNet-101 C4: (res1..res4 trunk, dilated stride-1 res5 head).

    `blocks`/`width_per_group` only change for tiny plumbing-test models."""
    # FrozenBN eps 1e-5, as detectron2.
    net = ResNet(Bottleneck, list(blocks), norm_layer=FrozenBatchNorm2d, width_per_group=width_per_group)
    # Caffe max-pool: no padding, ceil mode.
    net.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=0, ceil_mode=True)
    _stride_in_1x1(net.layer2[0])
    _stride_in_1x1(net.layer3[0])
    res5 = net.layer4
    # Visual Genome res5: stride 1 everywhere and dilation 2 in every 3x3 conv (14x14 stays 14x14).
    res5[0].conv2.stride = (1, 1)
    res5[0].downsample[0].stride = (1, 1)
    for block in res5:
        block.conv2.dilation = (2, 2)
        block.conv2.padding = (2, 2)
    return Stem(net, ("layer1", "layer2", "layer3")), res5


def build_x101_body(blocks=RESNET101_BLOCKS, groups: int = 64, width_per_group: int = 4) -> Stem:
    """ResNeXt-101 64x4d trunk with maskrcnn-benchmark's eps-free frozen BN; returns C2..C5."""
    net = ResNet(Bottleneck, list(blocks), groups=groups, width_per_group=width_per_group,
                 norm_layer=partial(FrozenBatchNorm2d, eps=0.0))
    return Stem(net, ("layer1", "layer2", "layer3", "layer4"))


class FPN(nn.Module):
    """Top-down FPN with nearest x2 upsampling; P6 = max-pool k1 s2 of P5."""

    def __init__(self, in_channels=(256, 512, 1024, 2048), out_channels: int = 512):
        super().__init__()
        for k, c in enumerate(in_channels, 1):
            setattr(self, f"fpn_inner{k}", nn.Conv2d(c, out_channels, 1))
            setattr(self, f"fpn_layer{k}", nn.Conv2d(out_channels, out_channels, 3, padding=1))
        self.num_levels = len(in_channels)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        n = self.num_levels
        last = getattr(self, f"fpn_inner{n}")(feats[-1])
        outs = [getattr(self, f"fpn_layer{n}")(last)]
        for k in range(n - 1, 0, -1):
            top_down = F.interpolate(last, scale_factor=2, mode="nearest")
            last = getattr(self, f"fpn_inner{k}")(feats[k - 1]) + top_down
            outs.insert(0, getattr(self, f"fpn_layer{k}")(last))
        outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2, padding=0))
        return outs
