"""Training data: a learnable synthetic set, CIFAR-10 and MNIST as 3x32x32 images, a synthetic token-sequence set,
sharded per rank."""

from __future__ import annotations

import functools
import gzip
import multiprocessing
import os
import pickle
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ddptop.config import RunConfig
from ddptop.errors import DataError

NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
DOWNLOAD_TIMEOUT_S = 10

# The synthetic set: learnable, but not in a few steps (issue 16). An image is
#   SIGNAL · a · shift(prototype of its class) + NOISE · gaussian noise          (unit variance overall)
# with a per-image amplitude a uniform in [0.5, 1.5] and a circular shift of up to ±SHIFT pixels each way, so a
# fixed template cannot match; classes come in PAIRS whose prototypes share a common pattern (correlation
# PAIR² = 0.36), so they are confused with each other first; and LABEL_NOISE of the training labels are drawn at
# random (the test labels are clean), which keeps the training loss above ~0.5 for good. Measured here
# (benchmarks/synthetic_difficulty.py: one process, batch 32, lr 0.05): the tiny CNN goes 2.31 → 0.91 in 200
# steps and 0.69 after 600, never 0 (before: 0.07 after 600); VGG-11 reaches 18% test accuracy after one epoch
# (README, "The synthetic data set").
SYNTHETIC_SIGNAL = 0.2
SYNTHETIC_NOISE = (1 - SYNTHETIC_SIGNAL**2) ** 0.5
SYNTHETIC_SHIFT = 4
SYNTHETIC_PAIR = 0.6
SYNTHETIC_LABEL_NOISE = 0.1

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILES = ("test_batch",)
CIFAR_META_FILE = "batches.meta"
MNIST_FOLDER = os.path.join("MNIST", "raw")
MNIST_FILES = tuple(
    f"{split}-{kind}-idx{dims}-ubyte" for split in ("train", "t10k") for kind, dims in (("images", 3), ("labels", 1))
)


class LabelledImages(TensorDataset):
    """Images and labels held as two tensors; an item is (image tensor, int label) like torchvision's sets."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.tensors
        return images[index], int(labels[index])


class SlowItems(Dataset):
    """Test-only: each item of `dataset` takes `seconds` longer to load, so a test can give a job a data path of
    known slowness (testhooks.model_tweaks: data-sleep-ms=N; with no loader workers it shows as `data`)."""

    def __init__(self, dataset: Dataset, seconds: float):
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return self.dataset[index]


# The token set (for bert-mini): sequences of TOKEN_LENGTH ids drawn from BERT's vocabulary; TOKEN_CLASSES marker
# tokens (picked by the seed) each stand for a class, and a sequence holds the markers of its class 3 times at
# random places among 28 ordinary tokens, plus one marker of another class once: the label is the marker that
# occurs most. A model must learn which 4 of 30522 embeddings matter and which of two markers it saw more often
# (a model that only spots markers is right half the time).
TOKEN_VOCAB = 30522
TOKEN_LENGTH = 32
TOKEN_CLASSES = 4
TOKEN_MARKS = 3


def token_datasets(seed: int, size: int) -> tuple[TensorDataset, TensorDataset]:
    """`size` training and size // 5 test sequences (int64 ids, int label), the same for a seed."""
    generator = torch.Generator().manual_seed(seed)
    markers = torch.randperm(TOKEN_VOCAB, generator=generator)[:TOKEN_CLASSES]
    return _token_set(markers, size, generator), _token_set(markers, max(1, size // 5), generator)


def _token_set(markers: torch.Tensor, count: int, generator: torch.Generator) -> TensorDataset:
    ids = torch.randint(0, TOKEN_VOCAB, (count, TOKEN_LENGTH), generator=generator)
    filler = next(i for i in range(TOKEN_CLASSES + 1) if i not in markers.tolist())
    ids[torch.isin(ids, markers)] = filler  # ordinary tokens are never markers
    labels = torch.randperm(count, generator=generator) % TOKEN_CLASSES
    other = (labels + torch.randint(1, TOKEN_CLASSES, (count,), generator=generator)) % TOKEN_CLASSES
    places = torch.argsort(torch.rand(count, TOKEN_LENGTH, generator=generator), dim=1)[:, :TOKEN_MARKS + 1]
    ids.scatter_(1, places[:, :TOKEN_MARKS], markers[labels].unsqueeze(1).expand(-1, TOKEN_MARKS))
    ids.scatter_(1, places[:, TOKEN_MARKS:], markers[other].unsqueeze(1))
    return LabelledTokens(ids, labels)


class LabelledTokens(TensorDataset):
    """Token sequences and labels; an item is (int64 ids of shape (TOKEN_LENGTH,), int label)."""

    num_classes = TOKEN_CLASSES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        ids, labels = self.tensors
        return ids[index], int(labels[index])


def ensure_dataset(cfg: RunConfig) -> None:
    """Check the data set named by cfg.dataset is usable, downloading cifar10/mnist into an existing --data-dir.

    Nothing is created that the user did not ask for (issue 26): a --data-dir that does not exist is an error, not
    a folder made on the spot (a typo would otherwise leave /nonexistent/dir behind), and a download goes to a
    temporary folder inside it whose files move into place only once all of them are there."""
    if cfg.dataset not in _FILES:  # generated from the seed, or the user's own (train.specs)
        return
    files, root = _FILES[cfg.dataset], _root(cfg)
    if not os.path.isdir(root):
        problem = "is not a directory" if os.path.exists(root) else "does not exist"
        raise DataError(f"--data-dir {root} {problem}: pass the folder that holds {files.name} "
                        f"({files.folder}{os.sep}); ddptop creates no data folder")
    files.prepare(root)
    if not files.missing(root):
        if cfg.dataset == "cifar10":  # read them here, once: a bad file is one line, not one per rank
            check_cifar(root)
        return
    try:
        with _socket_timeout(DOWNLOAD_TIMEOUT_S):
            _download(files, root)
    except Exception as exc:  # network, disk or archive: any of them leaves the set unusable
        raise DataError(f"{files.not_found(root)} and it could not be downloaded: {_one_line(exc)}; "
                        "put the files there or pass --data-dir") from None
    if files.missing(root):
        raise DataError(f"{files.not_found(root)} even after downloading; put the files there or pass --data-dir")


def _download(files: _Files, root: str) -> None:
    """Fetch into a temporary folder in root, then move the missing files into place; a failure leaves nothing."""
    staging = tempfile.mkdtemp(prefix=".ddptop-download-", dir=root)
    try:
        files.fetch(staging)
        if files.missing(staging):
            return  # the caller names what is still missing
        os.makedirs(os.path.join(root, files.folder), exist_ok=True)
        for name in files.missing(root):
            os.replace(os.path.join(staging, files.folder, name), os.path.join(root, files.folder, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_datasets(cfg: RunConfig) -> tuple[Dataset, Dataset]:
    """A built-in set's (train, test), never downloading; every item is (float tensor 3x32x32, int label 0..9),
    or for `tokens` (int64 ids, int label 0..3)."""
    if cfg.dataset == "synthetic":
        return synthetic_datasets(cfg.seed, cfg.synthetic_size)
    if cfg.dataset == "tokens":
        return token_datasets(cfg.seed, cfg.synthetic_size)
    files, root = _FILES[cfg.dataset], _root(cfg)
    if files.missing(root):
        raise DataError(f"{files.not_found(root)}; put the files there or pass --data-dir")
    try:
        return files.load(root)
    except DataError:
        raise
    except (OSError, EOFError, RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            AssertionError, pickle.UnpicklingError) as exc:
        raise DataError(f"{files.name} in {root} could not be read: {_one_line(exc)}") from None


def make_loader(
    dataset: Dataset, batch_size: int, rank: int, world_size: int, seed: int, train: bool, workers: int = 0,
    pin: bool = False, collate: Callable | None = None,
) -> tuple[DataLoader, DistributedSampler]:
    """A loader over this rank's shard; the caller calls sampler.set_epoch(epoch) every epoch. `collate`: the user's
    collate_fn (--collate; None: torch's default_collate).

    `workers` loader processes (kept for the loader's life) build batches beside the training thread; `pin`
    (CUDA) puts batches in page-locked memory, without which a `non_blocking=True` copy to the GPU is
    synchronous."""
    # drop_last on the training side gives every rank the same number of full batches, so no rank waits
    # in a collective for a peer that has already finished the epoch.
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=seed, drop_last=train
    )
    # workers fork from the rank, as torch's own default on Linux: a rank inherits its start method from how it was
    # started (spawn on a GPU, the forkserver for CPU ranks), and there a worker unpickles the data set and collate_fn
    # by module name, which a user's file loaded as `ddptop_user_…` (train/specs.py) has nowhere but in the rank: the
    # worker died with ModuleNotFoundError. A forked worker has the rank's modules and never touches CUDA.
    context = "fork" if workers > 0 and "fork" in multiprocessing.get_all_start_methods() else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=train,
                        pin_memory=pin, persistent_workers=workers > 0, collate_fn=collate,
                        multiprocessing_context=context)
    if len(loader) == 0:
        raise DataError(
            f"{len(dataset)} samples give no full batch of {batch_size} to each of {world_size} rank(s): "
            "use a smaller batch size or a larger data set (--synthetic-size)"
        )
    return loader, sampler


# --- synthetic ---


def synthetic_datasets(seed: int, size: int) -> tuple[LabelledImages, LabelledImages]:
    """`size` training and size // 5 test images around 10 shared class prototypes, the same for a seed."""
    generator = torch.Generator().manual_seed(seed)
    shifted = _shifted(_prototypes(generator))
    train = _noisy_copies(shifted, size, generator, SYNTHETIC_LABEL_NOISE)
    test = _noisy_copies(shifted, max(1, size // 5), generator, 0.0)
    return train, test


def _prototypes(generator: torch.Generator) -> torch.Tensor:
    # Random 4x4 patterns blown up to 32x32: smooth blobs that convolutions pick out, unlike pixel noise.
    # Classes 2k and 2k+1 share a pattern: PAIR of it and sqrt(1 − PAIR²) of their own.
    own = torch.randn(NUM_CLASSES, IMAGE_SHAPE[0], 4, 4, generator=generator)
    shared = torch.randn(NUM_CLASSES // 2, IMAGE_SHAPE[0], 4, 4, generator=generator).repeat_interleave(2, dim=0)
    coarse = SYNTHETIC_PAIR * shared + (1 - SYNTHETIC_PAIR**2) ** 0.5 * own
    smooth = F.interpolate(coarse, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False)
    smooth -= smooth.mean(dim=(1, 2, 3), keepdim=True)
    return smooth / smooth.std(dim=(1, 2, 3), keepdim=True)


def _shifted(prototypes: torch.Tensor) -> torch.Tensor:
    """Every prototype under every circular shift of up to ±SHIFT pixels: (classes · shifts², 3, 32, 32)."""
    offsets = range(-SYNTHETIC_SHIFT, SYNTHETIC_SHIFT + 1)
    return torch.stack([torch.roll(prototypes, (dy, dx), dims=(2, 3)) for dy in offsets for dx in offsets], dim=1)


def _noisy_copies(shifted: torch.Tensor, count: int, generator: torch.Generator, label_noise: float) -> LabelledImages:
    labels = torch.randperm(count, generator=generator) % NUM_CLASSES  # balanced classes in random order
    shift = torch.randint(0, shifted.shape[1], (count,), generator=generator)
    amplitude = torch.rand(count, 1, 1, 1, generator=generator).add_(0.5)
    images = torch.randn(count, *IMAGE_SHAPE, generator=generator).mul_(SYNTHETIC_NOISE)
    images.add_(shifted[labels, shift] * amplitude, alpha=SYNTHETIC_SIGNAL)
    flip = torch.rand(count, generator=generator) < label_noise
    labels = torch.where(flip, torch.randint(0, NUM_CLASSES, (count,), generator=generator), labels)
    return LabelledImages(images, labels)


# --- files on disk ---


@dataclass(frozen=True)
class _Files:
    """How one on-disk data set is found, fetched and read."""

    name: str
    folder: str
    names: tuple[str, ...]
    fetch: Callable[[str], None]
    load: Callable[[str], tuple[Dataset, Dataset]]
    prepare: Callable[[str], None] = lambda root: None  # what can be made from files already there

    def missing(self, root: str) -> list[str]:
        return [name for name in self.names if not os.path.isfile(os.path.join(root, self.folder, name))]

    def not_found(self, root: str) -> str:
        missing = self.missing(root)
        detail = "" if len(missing) == len(self.names) else f"; missing {', '.join(missing)}"
        return f"{self.name} not found in {root} (expected {self.folder}{os.sep}{detail})"


def _root(cfg: RunConfig) -> str:
    return os.path.abspath(os.path.expanduser(cfg.data_dir))


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    # urllib waits forever by default: a firewalled host would hang the launch instead of failing.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


# --- CIFAR-10 ---


def _fetch_cifar(root: str) -> None:
    from torchvision.datasets import CIFAR10  # torchvision costs ~1.8 s to import: only when needed

    CIFAR10(root, train=False, download=True)


def _load_cifar(root: str) -> tuple[Dataset, Dataset]:
    from torchvision import transforms

    augment = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
    normalize = [transforms.ToTensor(), transforms.Normalize(CIFAR_MEAN, CIFAR_STD)]
    cifar = _cifar10_class()
    return cifar(root, True, transforms.Compose(augment + normalize)), cifar(root, False, transforms.Compose(normalize))


@functools.cache
def _cifar10_class() -> type:
    from torchvision.datasets import CIFAR10, VisionDataset

    class LocalCIFAR10(CIFAR10):
        """torchvision's CIFAR10 that accepts any complete copy of the files and unpickles them safely."""

        def __init__(self, root: str, train: bool, transform: Callable) -> None:
            # CIFAR10.__init__ would run plain pickle.load on the files; read them here instead and keep
            # the rest of the class (item access, PIL conversion, repr).
            VisionDataset.__init__(self, root, transform=transform)
            self.train = train
            if not self._check_integrity():
                raise DataError(f"{_FILES['cifar10'].not_found(self.root)}; put the files there or pass --data-dir")
            folder = os.path.join(root, CIFAR_FOLDER)
            names = CIFAR_TRAIN_FILES if train else CIFAR_TEST_FILES
            self.data, self.targets = _read_cifar_batches([os.path.join(folder, name) for name in names])
            meta = _read_pickle(os.path.join(folder, CIFAR_META_FILE))
            self.classes = [_text(name) for name in meta["label_names"]]
            self.class_to_idx = {name: index for index, name in enumerate(self.classes)}

        def _check_integrity(self) -> bool:
            # The stock check compares MD5 sums of the official files, which rejects a trimmed copy (a test
            # fixture, a subset for a quick run) as corrupt; reading the files checks their content instead.
            return not _FILES["cifar10"].missing(self.root)

    return LocalCIFAR10


def check_cifar(root: str) -> None:
    """Every CIFAR-10 file reads and has what training needs, else one DataError line."""
    folder = os.path.join(root, CIFAR_FOLDER)
    try:
        for names in (CIFAR_TRAIN_FILES, CIFAR_TEST_FILES):
            _read_cifar_batches([os.path.join(folder, name) for name in names])
        meta = _read_pickle(os.path.join(folder, CIFAR_META_FILE))
        if not isinstance(meta.get("label_names"), (list, tuple)):
            raise DataError(f"{os.path.join(folder, CIFAR_META_FILE)}: no list of label_names")
    except DataError:
        raise
    except (OSError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError,
            pickle.UnpicklingError) as exc:
        raise DataError(f"CIFAR-10 in {root} could not be read: {_one_line(exc)}") from None


def _read_cifar_batches(paths: list[str]) -> tuple[np.ndarray, list[int]]:
    images, labels = [], []
    for path in paths:
        batch = _read_pickle(path)
        missing = [key for key in ("data", "labels") if key not in batch]
        if missing:
            raise DataError(f"{path}: a CIFAR batch needs 'data' and 'labels'; this one has no "
                            f"{' or '.join(repr(k) for k in missing)}")
        data = np.asarray(batch["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(batch["labels"]) != len(data):
            shapes = f"{data.shape} and {len(batch['labels'])}"
            raise DataError(f"{path}: expected N×3072 uint8 data and N labels, got {shapes}")
        images.append(data)
        labels.extend(int(label) for label in batch["labels"])
    if any(not 0 <= label < NUM_CLASSES for label in labels):
        raise DataError(f"{os.path.dirname(paths[0])}: labels must be 0..{NUM_CLASSES - 1}")
    # rows are channel-major (1024 red, 1024 green, 1024 blue); PIL wants height x width x channel
    hwc = np.concatenate(images).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(hwc), labels


# CIFAR batches are pickles of dicts, lists, strings and numpy arrays (written by Python 2 in the
# official files). Anything else, such as os.system, is refused: a data directory can come from anyone.
_PICKLE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module[len("numpy.core."):]  # numpy 2 deprecates numpy.core
        return super().find_class(module, name)


def _read_pickle(path: str) -> dict[str, object]:
    with open(path, "rb") as file:
        # latin1 turns Python 2 byte strings (keys and array buffers in the official files) into str
        content = _ArrayUnpickler(file, encoding="latin1").load()
    if not isinstance(content, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(content).__name__}")
    return {_text(key): value for key, value in content.items()}


def _text(value: object) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


# --- MNIST ---


def _fetch_mnist(root: str) -> None:
    from torchvision.datasets import MNIST

    MNIST(root, train=True, download=True)


def _gunzip_present(root: str) -> None:
    folder = os.path.join(root, MNIST_FOLDER)
    for name in MNIST_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path) and os.path.isfile(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as packed, open(path, "wb") as plain:
                shutil.copyfileobj(packed, plain)


def _load_mnist(root: str) -> tuple[Dataset, Dataset]:
    from torchvision import transforms
    from torchvision.datasets import MNIST

    # 28x28 grey padded to 32x32 and copied to three channels: every model sees CIFAR-shaped input
    transform = transforms.Compose([
        transforms.Pad(2),
        transforms.ToTensor(),
        transforms.Normalize(MNIST_MEAN, MNIST_STD),
        transforms.Lambda(_grey_to_rgb),
    ])
    splits = MNIST(root, train=True, transform=transform), MNIST(root, train=False, transform=transform)
    for split in splits:
        if len(split.targets) != len(split.data) or bool((split.targets >= NUM_CLASSES).any()):
            raise DataError(f"MNIST in {root}: {len(split.data)} images need as many labels, each 0..{NUM_CLASSES - 1}")
    return splits


def _grey_to_rgb(image: torch.Tensor) -> torch.Tensor:
    return image.repeat(3, 1, 1)


_FILES = {
    "cifar10": _Files("CIFAR-10", CIFAR_FOLDER, CIFAR_TRAIN_FILES + CIFAR_TEST_FILES + (CIFAR_META_FILE,),
                      _fetch_cifar, _load_cifar),
    "mnist": _Files("MNIST", MNIST_FOLDER, MNIST_FILES, _fetch_mnist, _load_mnist, _gunzip_present),
}
