"""Tests for labkit.data: MD5-checked MNIST, clear errors, the device fast path."""

import functools
import gzip
import http.server
import shutil
import threading

import pytest
import torch

from labkit import data


def test_prepare_verifies_and_unpacks(mnist_root):
    """Does prepare accept the original files offline and unpack them?"""
    assert data.prepare(mnist_root, download=False) == mnist_root
    assert (mnist_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").exists()


def test_missing_files_say_what_to_do(tmp_path):
    """Does an empty data folder give advice instead of a torchvision traceback?"""
    with pytest.raises(data.DataError, match=r"missing: .*labkit data prepare"):
        data.prepare(tmp_path, download=False)


def test_offline_env_never_downloads(tmp_path, monkeypatch):
    """Does LABKIT_OFFLINE=1 turn downloading off?"""
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    with pytest.raises(data.DataError, match="downloading is off"):
        data.prepare(tmp_path)


def test_failed_download_is_explained(tmp_path, monkeypatch):
    """Does a download failure (no network) become a DataError with the fix?"""

    def no_network(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no route")

    monkeypatch.setattr(data.datasets.MNIST, "download", no_network)
    with pytest.raises(data.DataError, match="Could not download MNIST.*--from FOLDER.*copy them into"):
        data.prepare(tmp_path, download=True)


def test_corrupt_file_is_an_md5_error(mnist_root):
    """Does a damaged .gz fail with an MD5 message naming the file?"""
    path = mnist_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(
        data.DataError, match=r"t10k-labels-idx1-ubyte.gz is corrupt: its MD5"
    ):
        data.prepare(mnist_root, download=False)


def test_a_read_only_folder_never_prepared_says_who_must_prepare_it(mnist_root,
                                                                   monkeypatch):
    """Shared read-only data with the files still packed: is that a DataError naming
    the command, not a PermissionError from the lock file? (As root nothing is
    read-only, so the folder's refusal is simulated.)"""
    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(data, "open", read_only, raising=False)
    with pytest.raises(data.DataError, match=r"read-only for you.*labkit data prepare "
                                             r"--root"):
        data.prepare(mnist_root, download=False)


def test_unreadable_unpacked_file(mnist_root):
    """Does a truncated unpacked file (gz intact) become a DataError?"""
    data.prepare(mnist_root, download=False)
    raw = mnist_root / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    raw.write_bytes(raw.read_bytes()[:1000])
    with pytest.raises(data.DataError, match="unreadable"):
        data.mnist(train=False, root=mnist_root)


def test_data_root_follows_env(tmp_path, monkeypatch):
    """Does LABKIT_DATA choose the folder?"""
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    assert data.data_root() == tmp_path


def test_device_data_matches_classic_transform(mnist_root):
    """Is the fast path normalized exactly like ToTensor + Normalize?"""
    fast = data.DeviceData.mnist(train=False, limit=5, root=mnist_root)
    classic = data.mnist(
        train=False, root=mnist_root, transform=data.classic_transform()
    )
    assert fast.images.shape == (5, 1, 28, 28) and fast.labels.dtype == torch.int64
    for i in range(5):
        image, label = classic[i]
        assert (
            torch.allclose(fast.images[i], image, atol=1e-5) and fast.labels[i] == label
        )


def test_batches_cover_every_sample_once():
    """Do batches visit each sample once, keep the short last batch, and reshuffle?"""
    source = data.DeviceData(torch.arange(10.0).view(10, 1, 1, 1), torch.arange(10))
    gen = torch.Generator().manual_seed(0)
    batches = source.batches(4, generator=gen)
    assert len(batches) == 3
    first = [y for _, y in batches]
    assert [len(y) for y in first] == [4, 4, 2]
    assert sorted(torch.cat(first).tolist()) == list(range(10))
    second = torch.cat([y for _, y in batches]).tolist()
    assert second != torch.cat(first).tolist()
    ordered = torch.cat([y for _, y in source.batches(3, shuffle=False)]).tolist()
    assert ordered == list(range(10))


def test_bad_batches_and_shapes():
    """Do a zero batch size and mismatched tensors raise clear errors?"""
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        data.DeviceData(torch.zeros(3, 1, 28, 28), torch.zeros(2))
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        data.DeviceData(torch.zeros(2, 1), torch.zeros(2)).batches(0)


def test_dataloader_limit(mnist_root):
    """Does the classic DataLoader honour limit and batch size?"""
    loader = data.dataloader(
        train=False, batch_size=4, num_workers=0, limit=10, root=mnist_root
    )
    assert len(loader.dataset) == 10
    images, labels = next(iter(loader))
    assert images.shape == (4, 1, 28, 28) and labels.shape == (4,)


def test_gz_files_are_real_idx(mnist_root):
    """Are the shipped files the real IDX data (magic number 2049 for labels)?"""
    with gzip.open(mnist_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz") as f:
        assert int.from_bytes(f.read(4), "big") == 2049


def test_random_batch_is_seeded():
    """Does random_batch give the same batch for the same seed, another for another?"""
    images, labels = data.random_batch(5, seed=3)
    again, _ = data.random_batch(5, seed=3)
    other, _ = data.random_batch(5, seed=4)
    assert images.shape == (5, 1, 28, 28) and labels.shape == (5,)
    assert int(labels.min()) >= 0 and int(labels.max()) <= 9
    assert torch.equal(images, again) and not torch.equal(images, other)


# ---------------------------------------------------------------- data and ranks


def load_in_rank(ctx, root):
    """Rank worker: load the training split from ``root`` (prepared or not)."""
    return len(data.DeviceData.mnist(train=True, root=root, limit=100))


def test_ranks_never_download_they_ask_for_preparing_first(tmp_path):
    """Does a rank on an empty data folder say to prepare before launching?"""
    from labkit import launch

    with pytest.raises(launch.WorkerError, match="ranks never download.*before launch"):
        launch.run(load_in_rank, 2, args=(str(tmp_path),), backend="gloo", timeout=30)


def test_ranks_unpack_a_fresh_folder_one_at_a_time(mnist_root):
    """With only the .gz files there, do two ranks both load (one unpacks, one waits)?"""
    from labkit import launch

    assert not (mnist_root / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()
    results = launch.run(load_in_rank, 2, args=(str(mnist_root),), backend="gloo",
                         timeout=60)
    assert results == [100, 100]


def test_begin_prepares_mnist_in_the_parent(mnist_root, monkeypatch, capsys):
    """Does labkit.begin(mnist=True) prepare the data here, before any launch?"""
    import labkit

    monkeypatch.setenv("LABKIT_DATA", str(mnist_root))
    labkit.begin(mnist=True)
    assert (mnist_root / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()
    assert "MNIST ready in" in capsys.readouterr().out


# MNIST from where the learner says (a folder, a mirror): issue 27, item 5.

def _originals():
    return data.data_root() / "MNIST" / "raw"


def test_prepare_copies_the_files_from_a_local_folder(tmp_path):
    """Does `prepare(source=FOLDER)` copy the .gz files, MD5-checked, offline?"""
    root = data.prepare(tmp_path / "fresh", download=False, source=str(_originals()))
    raw = root / "MNIST" / "raw"
    names = sorted(name for name, _md5 in data.datasets.MNIST.resources)
    assert sorted(p.name for p in raw.glob("*.gz")) == names
    assert (raw / "train-images-idx3-ubyte").exists()   # unpacked as well
    assert len(data.mnist(train=False, root=root)) == 10_000


def test_the_folder_may_be_a_data_root_and_comes_from_the_env(tmp_path, monkeypatch):
    """Does $LABKIT_MNIST_MIRROR name a folder that holds MNIST/raw/?"""
    monkeypatch.setenv("LABKIT_MNIST_MIRROR", str(data.data_root()))
    root = data.prepare(tmp_path, download=False)
    assert (root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").exists()


def test_a_changed_file_in_the_folder_is_refused(tmp_path):
    """Does a .gz that is not torchvision's original fail by its MD5, naming it?"""
    folder = tmp_path / "given"
    shutil.copytree(_originals(), folder, ignore=shutil.ignore_patterns("*ubyte"))
    bad = folder / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-4] + b"0000")
    with pytest.raises(data.DataError, match=r"t10k-labels-idx1-ubyte.gz is not the "
                       r"original file: its MD5 is not torchvision's ec29112d"):
        data.prepare(tmp_path / "fresh", download=False, source=str(folder))


def test_a_folder_without_the_files_says_which(tmp_path):
    with pytest.raises(data.DataError, match=r"train-images-idx3-ubyte.gz is not in "):
        data.prepare(tmp_path / "fresh", download=False, source=str(tmp_path))


def test_a_mirror_url_is_downloaded_md5_checked(tmp_path):
    """Does a mirror's URL (served here on loopback) fill a fresh folder?"""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(_originals()))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            root = data.prepare(tmp_path, download=True, source=url)
        finally:
            server.shutdown()
    assert (root / "MNIST" / "raw" / "t10k-images-idx3-ubyte").exists()


def test_a_mirror_url_is_not_fetched_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    with pytest.raises(data.DataError, match="downloading is off"):
        data.prepare(tmp_path, source="http://127.0.0.1:9/mnist/")
