"""MNIST from disk (MD5-checked by torchvision's list), the classic DataLoader, and the
device-resident fast path.

Taught in: lab 01 (data loading as a bottleneck); every later lab reuses ``DeviceData``.
Files live in ``$LABKIT_DATA/MNIST/raw/`` (torchvision's layout; default ``data/`` at
the repository root). They come from torchvision's hosts, or from where the learner
says (``prepare(source=...)``, ``labkit data prepare --from``,
``$LABKIT_MNIST_MIRROR``):
a folder holding the four original ``.gz`` files, or a mirror's URL; either way each
file is MD5-checked against torchvision's list. Nothing here substitutes synthetic data
when files are missing.
"""

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from urllib.error import URLError
from urllib.parse import urlparse

import torch

from labkit import hardware
from labkit.messages import _

__all__ = [
    "DataError",
    "MEAN",
    "STD",
    "data_root",
    "in_a_rank",
    "prepare",
    "mnist",
    "classic_transform",
    "random_batch",
    "dataloader",
    "DeviceData",
    "Batches",
]

MEAN, STD = 0.1307, 0.3081  # MNIST pixel mean and std, as in pytorch/examples
DATA_ENV, OFFLINE_ENV = "LABKIT_DATA", "LABKIT_OFFLINE"
MIRROR_ENV = "LABKIT_MNIST_MIRROR"   # a folder or a URL holding the four .gz files


class DataError(RuntimeError):
    """MNIST is missing, corrupt or not downloadable; the message says what to do."""


def data_root() -> Path:
    """Return the data folder: ``$LABKIT_DATA``, else ``data/`` at the repo root."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    return Path(__file__).resolve().parents[1] / "data"


def _raw_folder(root: Path) -> Path:
    return Path(root) / "MNIST" / "raw"


def __getattr__(name: str):
    """``data.datasets`` / ``data.transforms``: torchvision's, imported when asked.

    torchvision is imported only where MNIST is read: its import pulls in
    torch._dynamo (about 1.8 CPU-s more than torch itself, measured on this course's
    machine), which every fresh torchrun rank that only needs ``random_batch`` paid.
    """
    if name in ("datasets", "transforms"):
        import torchvision

        return getattr(torchvision, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _how_to_fix(raw: Path) -> str:
    from torchvision import datasets

    names = ", ".join(name for name, _md5 in datasets.MNIST.resources)
    return _(
        "Run `labkit data prepare` on a machine with internet access, or give it "
        "the four original files ({names}): `labkit data prepare --from FOLDER` (or "
        "a mirror's URL), or copy them into {folder}."
    ).format(names=names, folder=raw)


def _missing_files(root: Path) -> list[str]:
    """Return the missing .gz files; raise DataError on any whose MD5 is wrong."""
    from torchvision import datasets
    from torchvision.datasets.utils import check_integrity

    raw, missing = _raw_folder(root), []
    for name, md5 in datasets.MNIST.resources:
        path = raw / name
        if not path.exists():
            missing.append(name)
        elif not check_integrity(str(path), md5):
            raise DataError(
                _("{path} is corrupt: its MD5 is not torchvision's {md5}. "
                  "Delete it, then: {fix}").format(path=path, md5=md5,
                                                   fix=_how_to_fix(raw))
            )
    return missing


def in_a_rank() -> bool:
    """Tell whether this process is a rank started by ``launch.run`` or torchrun."""
    return any(name in os.environ for name in ("LABKIT_RANK", "RANK"))


@contextmanager
def _locked(raw: Path):
    """Hold an exclusive lock on the data folder: one preparer at a time.

    Ranks, two notebooks, or two learners sharing a data folder then never unpack
    the same file at once; the second finds the work done.
    """
    try:
        raw.mkdir(parents=True, exist_ok=True)
        lock = open(raw / ".prepare.lock", "w")
    except PermissionError:   # a shared, read-only folder that was never prepared
        raise DataError(_(
            "MNIST in {folder} is not ready (some files are missing or still packed), "
            "and this folder is read-only for you. Whoever runs this server: run "
            "`labkit data prepare --root {root}` once, then make it read-only.").format(
                folder=raw, root=raw.parent.parent)) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare(root=None, download: bool | None = None, source=None) -> Path:
    """Make sure MNIST is in ``root``, MD5-verified and unpacked; return ``root``.

    Missing files come from ``source`` (default ``$LABKIT_MNIST_MIRROR``): a folder
    holding the original ``.gz`` files (copied, also offline) or a mirror's URL;
    without one, from torchvision's hosts. Nothing is downloaded when ``download`` is
    False, ``LABKIT_OFFLINE=1`` is set (tests and CI never touch the network), or this
    is a rank: ranks never fetch (N ranks would fetch N copies at once); the notebook
    prepares the data before it launches them (``labkit.begin(mnist=True)``).
    """
    root = Path(root) if root is not None else data_root()
    if download is None:
        download = os.environ.get(OFFLINE_ENV, "") not in {"1", "true", "yes"}
    source = source or os.environ.get(MIRROR_ENV) or None
    raw = _raw_folder(root)
    if not _missing_files(root) and _unpacked(root):
        return root   # ready: only read (a read-only, shared folder stays untouched)
    with _locked(raw):
        missing = _missing_files(root)
        if missing and in_a_rank():
            raise DataError(
                _("MNIST is not in {folder} (missing: {missing}), and ranks never "
                  "download it. Prepare it once before launching: `data.prepare()` in "
                  "the notebook (labkit.begin(mnist=True) does), or `labkit data "
                  "prepare`.").format(folder=raw, missing=", ".join(missing))
            )
        if missing and source and (_is_folder(source) or download):
            _fetch(str(source), raw, missing)
            missing = _missing_files(root)
        if missing and not download:
            raise DataError(
                _("MNIST is not in {folder} (missing: {missing}) and downloading is "
                  "off. {fix}").format(folder=raw, missing=", ".join(missing),
                                        fix=_how_to_fix(raw))
            )
        _unpack_or_download(root, raw)
    return root


def _is_folder(source) -> bool:
    return urlparse(str(source)).scheme in ("", "file")


def _fetch(source: str, raw: Path, missing: list[str]) -> None:
    """Copy (a folder) or download (a mirror's URL) the ``missing`` .gz files into
    ``raw``, each MD5-checked against torchvision's list before it counts."""
    from torchvision import datasets
    from torchvision.datasets.utils import check_integrity, download_url

    md5s = dict(datasets.MNIST.resources)
    if not _is_folder(source):
        base = source if source.endswith("/") else source + "/"
        for name in missing:
            try:
                download_url(base + name, str(raw), filename=name, md5=md5s[name])
            except (URLError, OSError, RuntimeError) as err:
                raise DataError(_("Could not download {url}: {err}. {fix}").format(
                    url=base + name, err=err, fix=_how_to_fix(raw))) from err
        return
    folder = Path(urlparse(source).path if source.startswith("file:") else source
                  ).expanduser()
    for name in missing:
        found = next((p for p in (folder / name, _raw_folder(folder) / name)
                      if p.is_file()), None)
        if found is None:
            raise DataError(_("{name} is not in {folder} (nor in its MNIST/raw/): "
                              "give the folder that holds the four original .gz "
                              "files.").format(name=name, folder=folder))
        if not check_integrity(str(found), md5s[name]):
            raise DataError(_("{path} is not the original file: its MD5 is not "
                              "torchvision's {md5}.").format(path=found,
                                                             md5=md5s[name]))
        shutil.copyfile(found, raw / f"{name}.part")
        os.replace(raw / f"{name}.part", raw / name)


def _unpacked(root: Path) -> bool:
    """Tell whether torchvision's unpacked files are all there (both splits)."""
    from torchvision import datasets

    names = {Path(name).stem for name, _md5 in datasets.MNIST.resources}   # drop .gz
    return all((_raw_folder(root) / name).exists() for name in names)


def _unpack_or_download(root: Path, raw: Path) -> None:
    """Let torchvision unpack the verified .gz files, downloading what is missing."""
    from torchvision import datasets

    try:
        for train in (
            True,
            False,
        ):  # unpacks the verified .gz, downloads what is missing
            datasets.MNIST(root, train=train, download=True)
    except (URLError, OSError, RuntimeError) as err:
        raise DataError(
            _("Could not download MNIST into {folder}: {err}. {fix}").format(
                folder=raw, err=err, fix=_how_to_fix(raw))
        ) from err
    _missing_files(root)


def mnist(train: bool = True, root=None, transform=None):
    """Return torchvision's MNIST split after ``prepare`` (PIL images)."""
    from torchvision import datasets

    root = prepare(root)
    try:
        return datasets.MNIST(root, train=train, transform=transform)
    except (RuntimeError, ValueError, OSError) as err:
        raise DataError(
            _("The unpacked MNIST files in {folder} are unreadable ({err}). Delete "
              "the files without .gz there and run `labkit data prepare` again."
              ).format(folder=_raw_folder(root), err=err)
        ) from err


def classic_transform():
    """Return pytorch/examples' transform: ToTensor() then Normalize (brackets!)."""
    from torchvision import transforms

    return transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))]
    )


def random_batch(size: int, seed: int, device="cpu"):
    """Return a seeded batch of random (size, 1, 28, 28) images and labels 0-9.

    For equality proofs where the data does not matter (same seed, same batch on
    every rank); never a stand-in for missing MNIST.
    """
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 1, 28, 28, generator=gen)
    labels = torch.randint(0, 10, (size,), generator=gen)
    return images.to(device), labels.to(device)


def dataloader(
    train: bool = True,
    batch_size: int = 64,
    num_workers: int = 1,
    limit: int | None = None,
    root=None,
) -> torch.utils.data.DataLoader:
    """Return the classic DataLoader (pytorch/examples); ``limit`` keeps a prefix."""
    dataset = mnist(train, root, transform=classic_transform())
    if limit is not None:
        dataset = torch.utils.data.Subset(dataset, range(min(limit, len(dataset))))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


class DeviceData:
    """A whole split as normalized tensors on one device, batched by shuffled index.

    ``images``: (N, 1, 28, 28) float32, ``labels``: (N,) int64, both on ``device``.
    No DataLoader, no per-sample Python: one index gather per batch.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if len(images) != len(labels):
            raise ValueError(_("{images} images but {labels} labels.").format(
                images=len(images), labels=len(labels)))
        self.images, self.labels = images, labels

    @classmethod
    def mnist(
        cls, train: bool = True, device="cpu", limit: int | None = None, root=None
    ):
        """Load a split onto ``device``, normalized like ``classic_transform``."""
        device = hardware.as_device(device)
        split = mnist(train, root)
        pixels, labels = split.data[:limit], split.targets[:limit]  # (N, 28, 28) uint8
        images = pixels.unsqueeze(1).to(device).float().div_(255).sub_(MEAN).div_(STD)
        return cls(images, labels.to(device))

    def __len__(self) -> int:
        return len(self.labels)

    def batches(
        self, batch_size: int, shuffle: bool = True, generator=None
    ) -> "Batches":
        """Return an iterable of (images, labels) batches that has a length (for tqdm).

        Each pass draws a fresh permutation when shuffling; the last batch may be short.
        """
        if batch_size < 1:
            raise ValueError(_("batch_size must be at least 1, got {batch_size}."
                               ).format(batch_size=batch_size))
        return Batches(self, batch_size, shuffle, generator)


class Batches:
    """One pass over a ``DeviceData`` in batches: ``len()`` is the number of batches."""

    def __init__(self, source: DeviceData, batch_size: int, shuffle: bool, generator):
        self.source, self.batch_size = source, batch_size
        self.shuffle, self.generator = shuffle, generator

    def __len__(self) -> int:
        return -(-len(self.source) // self.batch_size)

    def __iter__(self):
        n, labels = len(self.source), self.source.labels
        order = (
            torch.randperm(n, generator=self.generator).to(labels.device)
            if self.shuffle
            else torch.arange(n, device=labels.device)
        )
        for start in range(0, n, self.batch_size):
            index = order[start : start + self.batch_size]
            yield self.source.images[index], labels[index]
