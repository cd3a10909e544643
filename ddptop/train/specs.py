"""The user's own model, data set and loss: `--model`, `--dataset` and `--loss` resolved to objects, one line for bad code.

A spec is `MODULE:CALLABLE`, `path/file.py:CALLABLE` or (models) `torchvision:NAME`, and is only ever read from the
command line or a profile file the user names: every rank imports it itself; the store, a recording and a report
carry it as text and nothing here is called from replay or report. Callables get keyword arguments, each only when
their signature takes it (or **kwargs):
  model:   num_classes (the data set's num_classes or len(classes); with cross-entropy else its largest target + 1)
  dataset: seed (--seed), size (--synthetic-size), data_dir (--data-dir)
  loss:    returns a scalar tensor; a class (an nn.Module such as nn.L1Loss) is instantiated with no arguments first.
  collate: the loaders' collate_fn (--collate; torch's default_collate without it), called with a list of items.
How the model and loss are called on a batch (train/batches.py, one rule): a pair (inputs, target) as
loss(model(inputs), target); any other batch (a dict, nested structures) as loss(model(batch), batch).
Exit codes: 2 for a spec that cannot be imported or called, or whose model or loss fails on a sample batch; 3 for
a data set that raises, returns something that is not a data set or is empty, or whose items make no batch.
"""

from __future__ import annotations

import importlib
import difflib
import importlib.util
import inspect
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from ddptop.config import DATASETS, IMAGE_DATASETS, MODELS, RunConfig, is_spec
from ddptop.errors import USER_FILES
from ddptop.errors import DataError, DdptopError, UsageError
from ddptop.train import batches, data, models

SAMPLE_ITEMS = 2  # the sample batch a spec is checked on (2: BatchNorm in training mode needs more than one value)
CLASS_SCAN = 10000  # items read to count classes when the data set has no num_classes (or classes) attribute


@dataclass
class Parts:
    """What a rank trains: built the same way on every rank (seeded), before the handshake compares parameters."""

    model: nn.Module
    train: Dataset
    test: Dataset | None
    loss: Callable[[Any, Any], torch.Tensor]
    classification: bool  # cross-entropy: accuracy and the test-set line mean something
    num_classes: int | None
    unused: tuple[str, ...] = ()  # parameters that got no gradient on the sample batch
    collate: Callable[[list], Any] | None = None  # the loaders' collate_fn (None: torch's default_collate)
    tokens: Callable[[Any], Any] | None = None  # a batch's token count (--tokens; None: batches.tokens' own rule)


def is_builtin(cfg: RunConfig) -> bool:
    return cfg.model in MODELS and cfg.dataset in DATASETS and not is_spec(cfg.loss) and not cfg.collate \
        and not cfg.tokens


def samples_are_images(dataset: str) -> bool:
    return dataset in IMAGE_DATASETS


def build(cfg: RunConfig, tweaks: dict | None = None, probe: bool | None = None) -> Parts:
    """The data set, then the model seeded with cfg.seed (the same weights on every rank), then the loss; with
    `probe` (default: any spec) one sample batch through them names the parameters that get no gradient."""
    tweaks = dict(tweaks or {})
    slow_data = tweaks.pop("data_sleep_s", 0.0)  # test-only (testhooks.model_tweaks): a slow data path
    train, test = _datasets(cfg)
    classification = cfg.loss == "cross-entropy"
    # a data set's own num_classes reaches the model whatever the loss; counting targets only for cross-entropy
    classes = num_classes(train, cfg.dataset) if classification or _declared(train) else None
    if slow_data:
        train = data.SlowItems(train, slow_data)
    torch.manual_seed(cfg.seed)
    model = _model(cfg.model, classes, tweaks)
    parts = Parts(model, train, test, _loss(cfg.loss), classification, classes,
                  collate=load("--collate", cfg.collate) if cfg.collate else None,
                  tokens=load("--tokens", cfg.tokens) if cfg.tokens else None)
    if probe if probe is not None else not is_builtin(cfg):
        parts.unused = try_batch(parts, cfg)
    return parts


# --- import ---


def load(flag: str, spec: str) -> Callable:
    """The callable a spec names, or one UsageError line: not importable, no such name, not callable."""
    where, _, name = spec.rpartition(":")
    module = _import(flag, spec, where)
    if getattr(module, "__file__", None):  # a failure inside it later is the user's, said so (errors.user_code_line)
        USER_FILES.add(os.path.abspath(module.__file__))
    value: Any = module
    for part in name.split("."):
        if not hasattr(value, part):
            near = difflib.get_close_matches(part, [n for n in dir(value) if not n.startswith("__")], n=1)
            raise UsageError(f"{flag} {spec}: {where} has no {part!r}"
                             + (f": did you mean {near[0]!r}?" if near else ""))
        value = getattr(value, part)
    if not callable(value):
        raise UsageError(f"{flag} {spec}: {name} is a {type(value).__name__}, not something to call")
    return value


def _import(flag: str, spec: str, where: str) -> Any:
    if not where.endswith(".py"):
        with _user_code(UsageError, f"{flag} {spec}: cannot import {where}"):
            return importlib.import_module(where)
    path = os.path.abspath(where)
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {spec}: no file {where}")
    name = "ddptop_user_" + re.sub(r"\W", "_", path)  # one module per file, whichever spec names it
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # what pickle (loader workers) and dataclasses look a class's module up in
    sys.path.insert(0, os.path.dirname(path))  # the file imports its neighbours as a script would
    try:
        with _user_code(UsageError, f"{flag} {spec}: cannot import {where}"):
            loader_spec.loader.exec_module(module)
    except DdptopError:
        del sys.modules[name]
        raise
    return module


@contextmanager
def _user_code(error: type[DdptopError], what: str) -> Iterator[None]:
    """The user's code raised: one line quoting its exception (DDPTOP_DEBUG=1: the traceback instead)."""
    try:
        yield
    except DdptopError:
        raise
    except (Exception, SystemExit) as exc:
        if os.environ.get("DDPTOP_DEBUG"):
            raise
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        joint = " " if what.endswith("raised") else ": "
        raise error(f"{what}{joint}{type(exc).__name__}{': ' + text if text else ''}") from None


def _call(fn: Callable, offered: dict[str, Any]) -> Any:
    """fn with the offered keyword arguments its signature takes."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: offer nothing
        return fn()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(**offered)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return fn(**{k: v for k, v in offered.items() if k in names})


# --- the three parts ---


def _datasets(cfg: RunConfig) -> tuple[Dataset, Dataset | None]:
    if cfg.dataset in DATASETS:
        return data.build_datasets(cfg)
    flag, spec = "--dataset", cfg.dataset
    factory = load(flag, spec)
    with _user_code(DataError, f"{flag} {spec} raised"):
        value = _call(factory, {"seed": cfg.seed, "size": cfg.synthetic_size, "data_dir": cfg.data_dir})
    if isinstance(value, tuple) and len(value) == 2 and all(_is_dataset(v) and not isinstance(v, tuple) for v in value):
        train, test = value
    elif _is_dataset(value):
        train, test = value, None
    else:
        raise DataError(f"{flag} {spec} returned a {type(value).__name__}: it must return a map-style Dataset "
                        "(with __len__ and __getitem__) or a (train, test) pair of them")
    with _user_code(DataError, f"{flag} {spec}: len() of its training set raised"):
        size = len(train)
    if size == 0:
        raise DataError(f"{flag} {spec} returned an empty training set")
    with _user_code(DataError, f"{flag} {spec}: its item 0 raised"):
        train[0]  # what the items are is the collate function's and the model's to say (sample_batch)
    return train, test


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset) or (hasattr(value, "__getitem__") and hasattr(value, "__len__")
                                          and not isinstance(value, (torch.Tensor, str, bytes, dict)))


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def num_classes(train: Dataset, name: str) -> int:
    """The data set's `num_classes` (or len of its `classes`), else the largest of its first CLASS_SCAN targets + 1."""
    if name in IMAGE_DATASETS:
        return data.NUM_CLASSES
    count = getattr(train, "num_classes", None)
    if count is None and isinstance(getattr(train, "classes", None), (list, tuple)):
        count = len(train.classes)
    if count is None:
        with _user_code(DataError, f"--dataset {name}: reading its targets raised"):
            targets = [train[i][1] for i in range(min(len(train), CLASS_SCAN))]
        try:
            count = int(max(int(t) for t in targets)) + 1
        except (TypeError, ValueError, RuntimeError):
            raise DataError(f"--dataset {name}: --loss cross-entropy needs whole-number class targets, got "
                            f"{_kind(targets[0])}; use --loss mse (or your own) for other targets") from None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DataError(f"--dataset {name}: num_classes must be a whole number ≥ 1, got {count!r}")
    return count


def _declared(train: Dataset) -> bool:
    return getattr(train, "num_classes", None) is not None or isinstance(getattr(train, "classes", None), (list, tuple))


def _model(spec: str, classes: int | None, tweaks: dict) -> nn.Module:
    if spec in MODELS:
        return models.build_model(spec, **tweaks, num_classes=classes or data.NUM_CLASSES)
    flag = "--model"
    if spec.startswith("torchvision:"):
        return models.not_in_place(_torchvision(spec, classes))
    factory = load(flag, spec)
    with _user_code(UsageError, f"{flag} {spec} raised"):
        model = _call(factory, {"num_classes": classes} if classes else {})
    if not isinstance(model, nn.Module):
        raise UsageError(f"{flag} {spec} returned a {type(model).__name__}: it must return a torch.nn.Module")
    return models.not_in_place(model)


def _torchvision(spec: str, classes: int | None) -> nn.Module:
    import torchvision.models

    name = spec.split(":", 1)[1]
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise UsageError(f"--model {spec}: torchvision has no classification model {name!r} "
                         "(torchvision.models.list_models() names them)")
    with _user_code(UsageError, f"--model {spec} raised"):
        return torchvision.models.get_model(name, weights=None, **({"num_classes": classes} if classes else {}))


def _loss(spec: str) -> Callable:
    if spec == "cross-entropy":
        return nn.CrossEntropyLoss()
    if spec == "mse":
        return nn.MSELoss()
    fn = load("--loss", spec)
    if inspect.isclass(fn):
        with _user_code(UsageError, f"--loss {spec} raised"):
            fn = fn()
    return fn


# --- one sample batch ---


def try_batch(parts: Parts, cfg: RunConfig) -> tuple[str, ...]:
    """One sample batch forward, through the loss and backward, leaving the model as it was (weights, buffers, the
    random state): one line for what does not fit together; returns the parameters that got no gradient."""
    batch = sample_batch(parts.train, cfg.dataset, parts.collate)
    if parts.tokens is not None:  # a count that raises or is no whole number: said now, not at some step
        with _user_code(UsageError, f"--tokens {cfg.tokens} raised on a batch of {SAMPLE_ITEMS}"):
            batches.tokens(batch, parts.tokens)
    inputs, targets = batches.split(batch)
    if inputs is batch and not is_spec(cfg.loss):
        raise DataError(f"--loss {cfg.loss} takes (output, target) from an (inputs, target) batch; this batch is "
                         f"{batches.describe(batch)}: give a loss of yours that takes (output, batch)")
    model, state = parts.model, {k: v.clone() for k, v in parts.model.state_dict().items()}
    rng = torch.random.get_rng_state()
    try:
        with _user_code(UsageError, f"--model {cfg.model} raised in forward on a batch of {SAMPLE_ITEMS}, "
                                    f"{_shape(inputs)}"):
            outputs = model(inputs)
        loss = _apply_loss(parts, cfg, outputs, targets)
        with _user_code(UsageError, f"--loss {cfg.loss}: backward raised"):
            loss.backward()
        return tuple(n for n, p in model.named_parameters() if p.requires_grad and p.grad is None)
    finally:
        model.zero_grad(set_to_none=True)
        model.load_state_dict(state)
        torch.random.set_rng_state(rng)


UNUSED_NAMED = 4  # parameters named in the warning; the rest are counted


def unused_note(names: tuple[str, ...], ddp_flag: str = "find_unused_parameters=True") -> str:
    """The one warning line naming the parameters that got no gradient, and what ddptop does about them."""
    shown = ", ".join(names[:UNUSED_NAMED]) + (f" and {len(names) - UNUSED_NAMED} more" if len(names) > UNUSED_NAMED
                                                 else "")
    return (f"{len(names)} parameter{'s' if len(names) != 1 else ''} got no gradient on the sample batch ({shown}): "
            f"ddp runs with {ddp_flag} (a walk of the autograd graph every step), the other strategies send zeros "
            "for them")


def sample_batch(train: Dataset, name: str, collate: Callable | None = None) -> Any:
    """The first SAMPLE_ITEMS items collated as the loader will (the user's collate_fn, else torch's
    default_collate), or one DataError line: a batch must hold a tensor whose first dimension is its size."""
    flag = f"--dataset {name}"
    with _user_code(DataError, f"{flag}: its first items raised"):
        items = [train[i] for i in range(min(SAMPLE_ITEMS, len(train)))]
    how = "--collate " + getattr(collate, "__name__", "") if collate else "torch's default_collate"
    with _user_code(DataError, f"{flag}: its items ({batches.describe(items[0])}) do not make a batch ({how})"):
        batch = (collate or default_collate)(items)
    if batches.size(batch) is None:
        raise DataError(f"{flag}: a batch must hold a tensor whose first dimension counts the samples; {how} made "
                        f"{batches.describe(batch)}")
    return batch


def _apply_loss(parts: Parts, cfg: RunConfig, outputs: Any, targets: Any) -> torch.Tensor:
    what = f"--loss {cfg.loss} cannot take the model's output {_shape(outputs)} with targets {_shape(targets)}"
    if cfg.loss == "mse" and isinstance(outputs, torch.Tensor) and isinstance(targets, torch.Tensor) \
            and outputs.shape != targets.shape:  # MSELoss would broadcast (2, 1) against (2,) to (2, 2) and train on
        raise UsageError(f"{what}: mse needs them in one shape")
    if parts.classification and isinstance(outputs, torch.Tensor) and (outputs.dim() != 2 or
                                                                       outputs.shape[1] < parts.num_classes):
        raise UsageError(f"{what}: cross-entropy needs (batch, classes ≥ {parts.num_classes}) scores")
    with _user_code(UsageError, what):
        loss = parts.loss(outputs, targets)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise UsageError(f"--loss {cfg.loss} returned {_shape(loss)}: it must return a scalar tensor with a gradient")
    return loss


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"of shape {tuple(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    return batches.describe(value)
