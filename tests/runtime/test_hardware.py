"""Tests for labkit.hardware and labkit.mode: the report and the backend choice."""

import re

import pytest
import torch

from labkit import hardware, mode


def test_report_works_without_gpu(capsys):
    """Does the report print versions, cores and the chosen backend with no GPU?"""
    setup = hardware.print_report()
    out = capsys.readouterr().out
    for label in (
        "PyTorch",
        "CUDA inside the torch wheel",
        "nvidia-smi",
        "CPU cores",
        "RAM",
        "NCCL available",
        "gloo available",
        "Backend:",
    ):
        assert label in out
    if torch.cuda.device_count() == 0:
        assert setup.backend == "gloo" and setup.device_type == "cpu"


def test_auto_without_gpus_is_gloo_and_says_why(capsys):
    """Does auto choose gloo CPU ranks, printing the GPU count and the reason?"""
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs: auto picks NCCL")
    setup = hardware.choose(2)
    assert (setup.backend, setup.device_type, setup.world_size) == ("gloo", "cpu", 2)
    assert setup.device(1) == torch.device("cpu")
    assert "GPU(s) found, 2 rank(s) wanted" in capsys.readouterr().out


def test_single_process_line(capsys):
    """Does a one-process lab print the device rather than a backend?"""
    hardware.choose(1)
    assert capsys.readouterr().out.startswith("Device: ")


def test_nccl_with_too_few_gpus_is_an_error():
    """Does asking NCCL for more GPUs than present fail before anything starts?"""
    found = torch.cuda.device_count()
    want = found + 1
    said = (rf"{want} rank\(s\) asked, {found} GPU\(s\) found. Ask for world_size <= "
            if found else "this machine has no GPU PyTorch can see. Use backend='gloo'")
    with pytest.raises(ValueError, match=rf"NCCL needs one GPU per rank: {said}"):
        hardware.choose(want, "nccl")


@pytest.mark.parametrize("found, want, words", [
    (0, 2, "this machine has no GPU PyTorch can see. Use backend='gloo'"),
    (2, 4, "4 rank(s) asked, 2 GPU(s) found. Ask for world_size <= 2, or use"),
])
def test_nccl_advice_never_asks_for_zero_ranks(found, want, words):
    """With no GPU, does the NCCL error say so instead of 'world_size <= 0'?"""
    advice = hardware._no_nccl_advice(want, found, True)
    assert words in advice and "<= 0" not in advice


@pytest.mark.parametrize("world_size", [0, -1, 1.5, "2", True])
def test_bad_world_size(world_size):
    """Is a world size that is not a positive integer rejected with its value?"""
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        hardware.choose(world_size)


def test_unknown_backend_lists_choices():
    """Does an unknown backend name list the valid ones?"""
    with pytest.raises(ValueError, match="choose one of auto, nccl, gloo"):
        hardware.choose(1, "mpi")


def test_gloo_is_always_cpu():
    """Does backend='gloo' give CPU ranks whatever the machine has?"""
    setup = hardware.choose(3, "gloo", verbose=False)
    assert setup.device_type == "cpu" and setup.device(2) == torch.device("cpu")


def test_quick_mode(monkeypatch, capsys):
    """Do is_quick, pick and begin follow LABKIT_QUICK and say so?"""
    monkeypatch.setenv("LABKIT_QUICK", "1")
    assert mode.is_quick() and mode.pick(100, 5) == 5
    mode.begin()
    assert "Mode: QUICK" in capsys.readouterr().out
    monkeypatch.setenv("LABKIT_QUICK", "0")
    assert not mode.is_quick() and mode.pick(100, 5) == 100
    assert "Mode: FULL" in mode.describe()


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", "Unknown device 'gpu': use 'cpu', 'cuda' or 'cuda:N'"),
        (f"cuda:{torch.cuda.device_count()}", "asked for, but this machine has"),
        ("cpu:1", "not a second device"),
        ("meta", "run on 'cpu' or 'cuda'"),
    ],
)
def test_bad_device_strings_are_explained(device, message):
    """Do unknown, absent and fake-second devices get a clear error, not torch's?"""
    with pytest.raises(ValueError, match=re.escape(message)):
        hardware.as_device(device)


def test_good_device_strings():
    """Are 'cpu', 'cpu:0' and torch.device('cpu') accepted?"""
    for device in ("cpu", "cpu:0", torch.device("cpu")):
        assert hardware.as_device(device).type == "cpu"


def test_data_and_fit_refuse_an_absent_gpu(mnist_root):
    """Do DeviceData and fit check the device before any work?"""
    from labkit import data, train

    absent = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match="asked for, but this machine has"):
        data.DeviceData.mnist(train=False, device=absent, limit=4, root=mnist_root)
    with pytest.raises(ValueError, match="Unknown device"):
        train.fit(None, None, None, 1, None, device="tpu0", plot=False)


@pytest.mark.parametrize("driver, wheel, words", [
    ("580.65.06", "13.2", "runs this wheel's CUDA 13.2"),    # 13.x on any 13 driver
    ("570.86.15", "13.0", "too old .* Update the driver, or install a wheel built for "
                          "CUDA 12.x"),
    ("525.60.13", "12.8", "runs this wheel's CUDA 12.8"),    # minor-version compatible
    (None, "13.0", "no NVIDIA driver found.*drivers >= 580"),
    (None, None, "CPU-only wheel"),
])
def test_driver_compatibility_follows_the_minor_version_rule(driver, wheel, words):
    """Same CUDA major and at least that major's oldest driver: does it say so?"""
    assert re.search(words, hardware.driver_compatibility(driver, wheel))


def test_report_says_whether_the_driver_runs_the_wheel():
    """Does the environment report carry the driver-vs-wheel row?"""
    rows = dict(hardware.report())
    assert "minor-version compatibility" in rows["driver vs wheel"] or \
        "CPU-only" in rows["driver vs wheel"]


def test_setup_names_its_devices():
    """Does a Setup say which devices its ranks use?"""
    assert hardware.Setup("gloo", "cpu", 2, "why").devices() == "cpu x2"


def test_the_report_speaks_chinese_in_a_chinese_notebook(monkeypatch, capsys):
    """Lab 00's first output in the Chinese edition: no English prose in it (the rule
    of tests/english_prose.py), its labels aligned by the columns they take."""
    from english_prose import english_runs

    monkeypatch.setenv("LABKIT_LANG", "zh_CN")
    hardware.print_report()
    out = capsys.readouterr().out
    assert "torch wheel 自带的 CUDA" in out and "gloo 可用" in out
    assert [line for line in out.splitlines() if english_runs(line)] == []
    labels = [label for label, _value in hardware.report()]
    width = max(map(hardware._columns, labels))
    for label in labels:                          # every value starts in one column
        line = next(line for line in out.splitlines() if line.startswith(label + " "))
        rest = line[len(label):]
        assert hardware._columns(label) + len(rest) - len(rest.lstrip(" ")) == width + 2
    assert hardware._columns("内存") == 4 and hardware._columns("RAM") == 3


def test_why_no_cluster_is_said_in_chinese(monkeypatch):
    """cluster.unavailable()'s reasons reach lab 03, 06 and 09's cells: in Chinese
    there, English on the command line."""
    from labkit import cluster

    monkeypatch.setattr(cluster, "_probe_result", {})
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cluster.sys, "platform", "linux")
    monkeypatch.setenv("LABKIT_LANG", "zh_CN")
    assert cluster.unavailable().startswith("需要 root 权限（这里 uid 为 1000）")
    monkeypatch.setattr(cluster, "_probe_result", {})
    monkeypatch.setenv("LABKIT_LANG", "en")
    assert cluster.unavailable().startswith("needs root (uid 1000 here)")
