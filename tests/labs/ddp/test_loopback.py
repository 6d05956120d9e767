"""Lab 03's torchrun check on a shared server: nothing of it listens beyond loopback,
or the check says so (labkit.privacy; CPU, gloo, torchrun with 2 ranks)."""

import pytest

from labkit import privacy
from labkit.labs.ddp import checks as ddp_checks
from listeners import ListenerWatch, is_loopback
from notebook_cells import solution_folder


@pytest.fixture
def lab03(tmp_path, monkeypatch):
    """Lab 03's solution modules in a folder the checks run from."""
    return solution_folder(tmp_path, monkeypatch, "03_ddp.ipynb",
                           ("ddp_worker.py", "ddp_script.py"))


def test_the_torchrun_check_exposes_nothing_beyond_loopback(lab03, capsys):
    """While the torchrun check runs (solution), does nothing of it listen beyond
    loopback on this machine's interfaces?"""
    if not privacy.private_network():
        pytest.skip("no unprivileged network namespaces here: the check says so instead")
    with ListenerWatch() as watch:
        ddp_checks.ddp_under_torchrun(str(lab03 / "ddp_script.py"),
                                      str(lab03 / "ddp_worker.py"))
    assert "ddp_under_torchrun: passed" in capsys.readouterr().out
    exposed = sorted(entry for entry in watch.seen if not is_loopback(entry[0]))
    assert not exposed, f"torchrun listened beyond loopback: {exposed}"


def test_without_a_namespace_the_check_says_torchrun_is_exposed(lab03, monkeypatch,
                                                                 capsys):
    """Where no private network namespace is allowed, does the check say that
    torchrun's stores listen on every interface, and is that true?"""
    monkeypatch.setattr(privacy, "private_network", lambda: False)
    with ListenerWatch() as watch:
        ddp_checks.ddp_under_torchrun(str(lab03 / "ddp_script.py"),
                                      str(lab03 / "ddp_worker.py"))
    out = capsys.readouterr().out
    assert "listen on every network interface" in out and "passed" in out
    assert any(not is_loopback(ip) for ip, _port in watch.seen), watch.seen
