"""A ResNet-18-size model, written here (torchvision is not a dependency).

`resnet18` is the CIFAR variant Pufferfish trains: a 3 x 3 stem convolution of 64 channels (no
max-pool), four stages of two basic blocks (64, 128, 256, 512 channels; the first block of
stages 2-4 halves the resolution, with a 1 x 1 projection on its shortcut), global average
pooling and a Linear classifier: 11,173,962 parameters for 10 classes. Any input of at least
8 x 8 pixels works; tests and benchmarks use small ones.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3 x 3 convolutions with batch norm, added to the (projected) input."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images (see the module docstring)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, width = [], 64
        for index, channels in enumerate((64, 128, 256, 512)):
            stride = 1 if index == 0 else 2
            stages.append(
                nn.Sequential(
                    BasicBlock(width, channels, stride), BasicBlock(channels, channels, 1)
                )
            )
            width = channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)


def resnet18(num_classes: int = 10) -> ResNet18:
    """A freshly initialised `ResNet18`."""
    return ResNet18(num_classes)
