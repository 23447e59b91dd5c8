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
import inspect
import math
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from unlearning.config import ConfigError

Builder = Callable[..., nn.Module]


class ModelError(ConfigError):
    """The team's model breaks the contract: `train.model` (its factory, its model file, its kwargs, its
    forward), or `train.init_checkpoint`. Bad input: reported in ONE line that names the field, the value and
    the fix (exit code 2; a subclass of ConfigError, so flows/errors.py's BAD_INPUT already covers it). The
    original exception is kept as `__cause__` (`--debug` shows its traceback)."""


def one_line(text: object, limit: int = 300) -> str:
    """An exception's text on one line (the `error:` line), cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# Frames that are not the team's code: the stdlib (importlib), installed packages (torch), this package.
_LIBRARY_DIRS = [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
_NOT_TEAM_CODE = tuple({str(Path(p).resolve()) for p in (*_LIBRARY_DIRS, Path(__file__).parents[1])})


def where(e: BaseException) -> str:
    """' (my_model.py, line 7)': the team's line that raised `e` (the innermost frame outside the stdlib,
    installed packages and this project's package), or '' when there is none."""
    if isinstance(e, SyntaxError) and e.filename:
        return f" ({Path(e.filename).name}, line {e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    team = [f for f in frames if not f.filename.startswith("<")
            and not str(Path(f.filename).resolve()).startswith(_NOT_TEAM_CODE)]
    return f" ({Path(team[-1].filename).name}, line {team[-1].lineno})" if team else ""


def describe(e: BaseException) -> str:
    """'KeyError: 'width' (my_model.py, line 7)': what the team's code raised, on one line."""
    return f"{type(e).__name__}: {one_line(e)}{where(e)}"


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


def spec_from(model_cfg, in_shape, n_classes: int) -> dict:
    """The architecture spec `build_model` takes, from params.yaml's `train.model` (a pydantic model) and the
    data's input shape and class count."""
    return {"arch": model_cfg.arch, "in_shape": [int(s) for s in in_shape], "n_classes": int(n_classes),
            "kwargs": arch_kwargs(model_cfg.model_dump()), "factory": model_cfg.factory,
            "feature_layer": model_cfg.feature_layer}


def copy_value(v):
    return list(v) if isinstance(v, (list, tuple)) else v


def import_factory(ref: str, search_paths: Sequence[str | Path] = ()) -> Builder:
    """`"module.path:callable"` -> the callable. `search_paths` (the project folder) are tried first."""
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise ModelError(f"train.model.factory = {ref!r}: expected 'module.path:callable', e.g. 'my_model:build'")
    module_name, attr = ref.split(":")
    for p in reversed([str(Path(p).resolve()) for p in search_paths]):
        if p not in sys.path:
            sys.path.insert(0, p)
    module = _import_model_file(ref, module_name, search_paths)
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ModelError(f"train.model.factory = {ref!r}: module {module_name!r} has no attribute {attr!r}; "
                             f"name a function (or class) defined in {module_name.replace('.', '/')}.py")
    if not callable(fn):
        raise ModelError(f"train.model.factory = {ref!r}: {attr!r} is not callable; name the function that "
                         f"builds the module")
    return fn


def _import_model_file(ref: str, module_name: str, search_paths: Sequence[str | Path]):
    """Import the factory's module; every failure is a ModelError saying WHICH import failed: the model file
    itself (missing), a package it imports (not installed), or its own code (SyntaxError, NameError, ...)."""
    file = f"{module_name.replace('.', '/')}.py"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # e.name is the module that was not found: the model file (or a package of its dotted path), or a
        # dependency the file imports; "Put my_model.py in the project folder" only fits the first case.
        missing = e.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            folder = f" ({Path(search_paths[0]).resolve()})" if search_paths else ""
            raise ModelError(f"train.model.factory = {ref!r}: cannot import module {module_name!r} (no module "
                             f"named {missing!r}). Put {file} in the project folder{folder}, beside params.yaml, or "
                             f"install the package that provides it") from e
        raise ModelError(f"train.model.factory = {ref!r}: {file} was found, but importing it failed: it imports "
                         f"{missing!r}, which is not installed{where(e)} (nor a module beside it); install the "
                         f"package that provides {missing!r} in the project's environment, put "
                         f"{missing.replace('.', '/')}.py beside {file}, or remove the import") from e
    except Exception as e:  # noqa: BLE001 - the team's file: SyntaxError, NameError, ImportError, anything at import
        raise ModelError(f"train.model.factory = {ref!r}: importing {file} failed with {describe(e)}; fix the "
                         f"model file") from e


def builder_for(arch: str, factory: str | None = None, search_paths: Sequence[str | Path] = ()) -> Builder:
    if arch == "custom":
        if not factory:
            raise ModelError("train.model.arch = 'custom' needs train.model.factory: 'module.path:callable'")
        return import_factory(factory, search_paths)
    if arch not in ARCHITECTURES:
        raise ModelError(f"train.model.arch = {arch!r} is not known; allowed: {[*sorted(ARCHITECTURES), 'custom']}")
    return ARCHITECTURES[arch]


def model_field(builder: Builder) -> str:
    """How an error names the model setting: `train.model.arch = 'mlp'` or `train.model.factory = 'm:build'`."""
    for arch, b in ARCHITECTURES.items():
        if builder is b:
            return f"train.model.arch = {arch!r}"
    return f"train.model.factory = '{getattr(builder, '__module__', '?')}:{getattr(builder, '__qualname__', builder)}'"


def _builder_name(builder: Builder) -> str:
    return getattr(builder, "__qualname__", repr(builder))


def checked_module(builder: Builder, in_shape: Sequence[int], n_classes: int, kwargs: dict) -> nn.Module:
    """Call the builder and check the contract: an nn.Module mapping [B, *in_shape] -> [B, n_classes].
    Whatever the builder raises becomes a ModelError naming the setting (its cause kept)."""
    name, field = _builder_name(builder), model_field(builder)
    shape = tuple(int(s) for s in in_shape)
    _check_kwargs(builder, shape, n_classes, kwargs)
    try:
        module = builder(in_shape=shape, n_classes=int(n_classes), **kwargs)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - the team's factory: report whatever it raised, in one line
        if isinstance(e, TypeError) and any(repr(str(k)) in str(e) for k in kwargs):  # passed on by **kwargs
            raise _kwargs_error(builder, kwargs, e) from e
        if field.startswith("train.model.arch"):  # the built-in architectures' errors name the field already
            raise ModelError(one_line(e)) from e
        raise ModelError(f"{field}: {name}(in_shape={shape}, n_classes={int(n_classes)}, **train.model.kwargs="
                         f"{kwargs}) raised {describe(e)}; fix the factory (it gets in_shape, n_classes and "
                         f"train.model.kwargs and returns a new nn.Module)") from e
    if not isinstance(module, nn.Module):
        raise ModelError(f"{field}: model builder {name} returned {type(module).__name__}, expected a "
                         f"torch.nn.Module; return the module itself (e.g. `return nn.Sequential(...)`)")
    _materialize_lazy(module, shape, field)
    _check_initial_values(module, field)
    return module


def _materialize_lazy(module: nn.Module, in_shape: tuple, field: str) -> None:
    """Lazy modules (nn.LazyLinear, nn.LazyConv2d, ...) create their parameters on the first forward: run one on
    zeros here, inside the member's seeded build, so each member's parameters are drawn from its own seed (and
    stack like any others: stacking an uninitialised parameter raised a bare ValueError)."""
    if not any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters()) and not any(
            isinstance(b, nn.parameter.UninitializedBuffer) for b in module.buffers()):
        return
    dtype = next((p.dtype for p in module.parameters()
                  if not isinstance(p, nn.parameter.UninitializedParameter) and p.is_floating_point()), None)
    was_training = module.training
    try:
        with torch.no_grad():
            module.eval()(torch.zeros(2, *in_shape, dtype=dtype))
    except Exception as e:  # noqa: BLE001 - the team's forward: report whatever it raised
        raise ModelError(f"{field}: {type(module).__name__} has lazy parameters, and the first forward that creates "
                         f"them failed on zeros of shape [2, {', '.join(map(str, in_shape))}] (the prepared data's "
                         f"in_shape): {describe(e)}") from e
    finally:
        module.train(was_training)


# Larger than any initialisation draws (|N(0, 1)| > 1e6 never happens): uninitialised memory
_INIT_LIMIT = 1e6


def _check_initial_values(module: nn.Module, field: str) -> None:
    """Parameters that hold NaN, inf or values beyond _INIT_LIMIT when built: uninitialised memory
    (torch.nn.utils.skip_init without reset_parameters, torch.empty); training on it diverges or, worse, runs."""
    bad = []
    for name, p in module.named_parameters():
        if p.is_floating_point() and p.numel() and p.device.type != "meta":
            a = p.detach()
            if not torch.isfinite(a).all() or a.abs().max() > _INIT_LIMIT:
                bad.append(f"{name!r} (max |value| {a.abs().max().item():.3g})")
    if bad:
        raise ModelError(f"{field}: {type(module).__name__} is built with uninitialised parameters: {', '.join(bad[:4])}"
                         f"{' ...' if len(bad) > 4 else ''} hold NaN, inf or values above {_INIT_LIMIT:g}; "
                         f"initialise them in the factory (torch.nn.utils.skip_init needs a reset_parameters() "
                         f"call; torch.empty needs an nn.init function)")


def _check_kwargs(builder: Builder, in_shape: tuple, n_classes: int, kwargs: dict) -> None:
    """The factory's signature takes (in_shape, n_classes, **kwargs): checked before the call, so a TypeError
    raised INSIDE the factory is reported as the factory's own error, not as a kwargs mismatch."""
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):  # no signature to read (a C callable): the call will tell
        return
    try:
        sig.bind(in_shape=in_shape, n_classes=int(n_classes), **kwargs)
    except TypeError as e:
        raise _kwargs_error(builder, kwargs, e, sig) from e


def _kwargs_error(builder: Builder, kwargs: dict, e: TypeError, sig: inspect.Signature | None = None) -> ModelError:
    signature = f"; its signature is ({', '.join(str(p) for p in sig.parameters.values())})" if sig else ""
    return ModelError(f"train.model.kwargs = {kwargs}: model builder {_builder_name(builder)}(in_shape, n_classes, "
                      f"**train.model.kwargs={kwargs}) failed: {one_line(e)}{where(e)}{signature}: the factory must "
                      f"take in_shape, n_classes and every key of train.model.kwargs; rename or drop the keys it "
                      f"does not take")


def check_output_shape(module: nn.Module, in_shape: Sequence[int], n_classes: int,
                       field: str = "train.model") -> list[str]:
    """Run the module once on zeros [2, *in_shape] (eval mode, no grad) and check it returns logits
    [2, n_classes]. Returns the names of its nn.Linear layers in the order the forward pass CALLED them
    (a layer called twice counts where it was called last): the default feature layer is the last one."""
    scripted = [name or "(the module itself)" for name, m in module.named_modules()
                if isinstance(m, torch.jit.ScriptModule)]
    if scripted:  # stack_module_state failed on them with a bare AssertionError ("param must be a Parameter")
        raise ModelError(f"{field}: {type(module).__name__} is or holds TorchScript modules ({scripted[:4]}); the "
                         f"pipeline stacks and transforms the module with torch.func, which TorchScript does not "
                         f"support: return the plain nn.Module (drop torch.jit.script / torch.jit.trace; script "
                         f"the unlearned model for serving afterwards)")
    was_training = module.training
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name, p in module.named_parameters():
        if p.is_floating_point():
            by_dtype.setdefault(p.dtype, []).append(name)
    if len(by_dtype) > 1:
        # the ensemble, its copies and the data move to ONE dtype: a float64 parameter beside float32 ones was
        # cast silently (or the probe below failed in the team's forward with a dtype error that blamed it)
        kinds = "; ".join(f"{str(d).replace('torch.', '')}: {names[:4]}{' ...' if len(names) > 4 else ''}"
                          for d, names in by_dtype.items())
        raise ModelError(f"{field}: {type(module).__name__}'s parameters have more than one floating dtype "
                         f"({kinds}); the pipeline trains, unlearns and evaluates the model in one dtype (it moves "
                         f"every parameter and the data to it): build every parameter in the same dtype "
                         f"(float32: drop the .double() or dtype=torch.float64 of those parameters)")
    dtype = next(iter(by_dtype), torch.get_default_dtype())
    names = {m: n for n, m in module.named_modules() if isinstance(m, nn.Linear)}
    called: list[str] = []
    hooks = [m.register_forward_hook(lambda m, _i, _o: called.append(names[m])) for m in names]
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(2, *in_shape, dtype=dtype))
    except Exception as e:  # noqa: BLE001 - the user's module: report whatever it raised
        raise ModelError(f"{field}: {type(module).__name__} failed on an input of shape [2, "
                         f"{', '.join(map(str, in_shape))}] (the prepared data's in_shape): {describe(e)}; its "
                         f"forward must map [B, *in_shape] to [B, n_classes] logits") from e
    finally:
        for h in hooks:
            h.remove()
        module.train(was_training)
    if not isinstance(out, torch.Tensor):
        what = (f"a dict with keys {list(out)[:5]}" if isinstance(out, dict) else
                f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else
                f"a {type(out).__name__}")
        raise ModelError(f"{field}: {type(module).__name__}.forward returned {what}, not a tensor; the pipeline needs "
                         f"the logits alone, one tensor [B, n_classes] = [2, {n_classes}]: return only the logits "
                         f"(e.g. `return logits`, not `return logits, features`)")
    if tuple(out.shape) != (2, int(n_classes)):
        raise ModelError(f"{field}: {type(module).__name__} maps [2, *{list(in_shape)}] to {list(out.shape)}; the "
                         f"pipeline needs [B, n_classes] = [2, {n_classes}] logits: size the last layer with the "
                         f"factory's n_classes argument (here {n_classes})")
    if out.dtype != dtype:
        d, o = str(dtype).replace("torch.", ""), str(out.dtype).replace("torch.", "")
        raise ModelError(f"{field}: {type(module).__name__} returns {o} logits from {d} parameters (torch.autocast "
                         f"inside forward, or a cast of the logits). torch.func, which trains and differentiates the "
                         f"stacked members, ignores autocast: the members would compute in {d} while the module you "
                         f"get back computes in {o}. Drop the autocast or cast from forward (run the unlearned "
                         f"module under autocast when serving it), or build the whole module in {o}")
    seen: dict[str, None] = {}
    for n in called:  # last call wins: order by each layer's last call
        seen.pop(n, None)
        seen[n] = None
    return list(seen)


def feature_layer_of(module: nn.Module, called_linears: Sequence[str]) -> str:
    """The default feature layer: the last nn.Linear the forward pass called (the one whose INPUT is the
    penultimate feature); the last one registered when the probe saw none called."""
    if called_linears:
        return called_linears[-1]
    return last_linear(module)


def last_linear(module: nn.Module) -> str:
    """Name of the last nn.Linear in module order (whose INPUT is the default penultimate feature)."""
    names = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        layers = [n for n, _ in module.named_modules() if n][:12]
        raise ModelError(f"train.model.feature_layer = null: {type(module).__name__} has no nn.Linear layer, so "
                         f"the penultimate feature (deletion.partition.mode: embedding) is not defined; set "
                         f"train.model.feature_layer to the name of the layer whose INPUT is that feature "
                         f"(one of {layers}) or use another partition mode")
    return names[-1]


def linear_chain(module: nn.Module) -> list[str] | None:
    """For the project's `MLP` (Linear + ReLU chain), the Linear layers' names in order; else None.
    The fused training kernel and the leverage closed forms use this as their fast path."""
    if type(module) is not MLP:
        return None
    return [f"body.{i}" for i in range(len(module.body))] + ["out"]
