"""The architectures the pipeline can build: plain `nn.Module`s mapping [B, *in_shape] -> [B, n_classes].

Every entry is a builder `(in_shape, n_classes, **kwargs) -> nn.Module`. The ensemble adapter
(`unlearning.models.ensemble`) turns any such module into N independent members, so nothing else in
the project needs to know which architecture it holds:

- `mlp`: flatten, Linear + ReLU per hidden size, Linear head (the fused training kernel's fast path).
- `cnn`: per channel entry conv3x3 (padding 1) + ReLU + maxpool 2, then a Linear head.
- `resnet`: a small CIFAR-style ResNet with BatchNorm (basic blocks, global average pooling).
- `custom`: a team's own factory `"module.path:callable"`, called with `in_shape`, `n_classes` and
  `train.model.kwargs`, importable from the project folder or an installed package.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

Builder = Callable[..., nn.Module]


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU] per hidden size -> Linear head."""

    def __init__(self, in_shape: Sequence[int], n_classes: int, hidden: Sequence[int] = (32,)):
        super().__init__()
        dims = [math.prod(in_shape), *hidden]
        self.body = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = nn.Linear(dims[-1], n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        for layer in self.body:
            h = torch.relu(layer(h))
        return self.out(h)


class CNN(nn.Module):
    """[conv3x3 -> ReLU -> maxpool 2] per channel entry, then a Linear head; input [B, C, H, W]."""

    def __init__(self, in_shape: Sequence[int], n_classes: int, channels: Sequence[int] = (8, 16)):
        super().__init__()
        c, h, w = _image_shape(in_shape, "cnn")
        chans = [c, *channels]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans[:-1], chans[1:]))
        for _ in channels:
            h, w = h // 2, w // 2
        if h < 1 or w < 1:
            raise ValueError(f"train.model.channels = {list(channels)}: {len(channels)} poolings shrink a "
                             f"{list(in_shape)} image to nothing; use fewer channel entries")
        self.out = nn.Linear(chans[-1] * h * w, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for conv in self.convs:
            h = nn.functional.max_pool2d(torch.relu(conv(h)), 2)
        return self.out(h.flatten(1))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus the (projected when the shape changes) input, then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """Small CIFAR-style ResNet (He et al. 2016, §4.2): a 3x3 stem, one stage per width (stride 1 for the
    first, 2 after), `blocks` basic blocks per stage, global average pooling, a Linear head."""

    def __init__(self, in_shape: Sequence[int], n_classes: int, widths: Sequence[int] = (16, 32, 64),
                 blocks: int = 1):
        super().__init__()
        c, _, _ = _image_shape(in_shape, "resnet")
        self.stem = nn.Sequential(nn.Conv2d(c, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        layers, c_in = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(BasicBlock(c_in, w, stride=2 if (i > 0 and j == 0) else 1))
                c_in = w
        self.stages = nn.Sequential(*layers)
        self.out = nn.Linear(c_in, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages(self.stem(x))
        return self.out(h.mean((2, 3)))


def _image_shape(in_shape: Sequence[int], arch: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ValueError(f"train.model.arch = {arch!r} needs image inputs [C, H, W], but the prepared data has "
                         f"in_shape {list(in_shape)}; use arch 'mlp' (or 'custom') for tables")
    return int(in_shape[0]), int(in_shape[1]), int(in_shape[2])


ARCHITECTURES: dict[str, Builder] = {"mlp": MLP, "cnn": CNN, "resnet": ResNet}
# The train.model keys each built-in architecture takes (a custom factory takes train.model.kwargs).
ARCH_KEYS: dict[str, tuple[str, ...]] = {"mlp": ("hidden",), "cnn": ("channels",), "resnet": ("widths", "blocks")}


def arch_kwargs(model_cfg: dict) -> dict:
    """The builder's keyword arguments from a `train.model` dict: its arch's own keys, or `kwargs` for custom."""
    arch = model_cfg["arch"]
    if arch in ARCH_KEYS:
        return {k: copy_value(model_cfg[k]) for k in ARCH_KEYS[arch]}
    return dict(model_cfg.get("kwargs") or {})


def copy_value(v):
    return list(v) if isinstance(v, (list, tuple)) else v


def import_factory(ref: str, search_paths: Sequence[str | Path] = ()) -> Builder:
    """`"module.path:callable"` -> the callable. `search_paths` (the project folder) are tried first."""
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise ValueError(f"train.model.factory = {ref!r}: expected 'module.path:callable', e.g. 'my_model:build'")
    module_name, attr = ref.split(":")
    for p in reversed([str(Path(p).resolve()) for p in search_paths]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"train.model.factory = {ref!r}: cannot import module {module_name!r} ({e}). Put "
                         f"{module_name.replace('.', '/')}.py in the project folder (beside params.yaml) or install "
                         f"the package that provides it") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"train.model.factory = {ref!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"train.model.factory = {ref!r}: {attr!r} is not callable")
    return fn


def builder_for(arch: str, factory: str | None = None, search_paths: Sequence[str | Path] = ()) -> Builder:
    if arch == "custom":
        if not factory:
            raise ValueError("train.model.arch = 'custom' needs train.model.factory: 'module.path:callable'")
        return import_factory(factory, search_paths)
    if arch not in ARCHITECTURES:
        raise ValueError(f"train.model.arch = {arch!r} is not known; allowed: {[*sorted(ARCHITECTURES), 'custom']}")
    return ARCHITECTURES[arch]


def checked_module(builder: Builder, in_shape: Sequence[int], n_classes: int, kwargs: dict) -> nn.Module:
    """Call the builder and check the contract: an nn.Module mapping [B, *in_shape] -> [B, n_classes]."""
    name = getattr(builder, "__qualname__", repr(builder))
    try:
        module = builder(in_shape=tuple(int(s) for s in in_shape), n_classes=int(n_classes), **kwargs)
    except TypeError as e:
        raise ValueError(f"model builder {name}(in_shape, n_classes, **train.model.kwargs={kwargs}) failed: {e}") from None
    if not isinstance(module, nn.Module):
        raise ValueError(f"model builder {name} returned {type(module).__name__}, expected a torch.nn.Module")
    return module


def check_output_shape(module: nn.Module, in_shape: Sequence[int], n_classes: int) -> None:
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(2, *in_shape))
    except Exception as e:  # noqa: BLE001 - the user's module: report whatever it raised
        raise ValueError(f"{type(module).__name__} failed on an input of shape [2, {', '.join(map(str, in_shape))}] "
                         f"(the prepared data's in_shape): {type(e).__name__}: {e}") from None
    finally:
        module.train(was_training)
    if tuple(out.shape) != (2, int(n_classes)):
        raise ValueError(f"{type(module).__name__} maps [2, *{list(in_shape)}] to {list(out.shape)}; the pipeline "
                         f"needs [B, n_classes] = [2, {n_classes}] logits")


def last_linear(module: nn.Module) -> str:
    """Name of the last nn.Linear in module order (whose INPUT is the default penultimate feature)."""
    names = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(module).__name__} has no nn.Linear layer; set train.model.feature_layer to the "
                         f"name of the layer whose input is the penultimate feature (see module.named_modules())")
    return names[-1]


def linear_chain(module: nn.Module) -> list[str] | None:
    """For the project's `MLP` (Linear + ReLU chain), the Linear layers' names in order; else None.
    The fused training kernel and the leverage closed forms use this as their fast path."""
    if type(module) is not MLP:
        return None
    return [f"body.{i}" for i in range(len(module.body))] + ["out"]
