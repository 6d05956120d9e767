"""Tests for the labkit command."""

import subprocess
import sys

import pytest

from labkit import cli, labs


def test_doctor_runs_as_a_command():
    """Does `labkit doctor` exit 0 and print the backend choice?"""
    done = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Backend:" in done.stdout


def test_prepare_offline_into_a_fresh_folder(mnist_root, capsys):
    """Does `labkit data prepare --offline` verify copied files?"""
    assert cli.main(["data", "prepare", "--root", str(mnist_root), "--offline"]) == 0
    assert "MD5 verified" in capsys.readouterr().out


def test_prepare_error_is_one_line(tmp_path, capsys):
    """Does a missing data set give exit 2 and a one-line error, not a traceback?"""
    assert cli.main(["data", "prepare", "--root", str(tmp_path), "--offline"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("labkit data: error: MNIST is not in") and "Traceback" not in err
    )


def test_build_labs_check_passes_on_the_repository(capsys):
    """Does `labkit build-labs --check` report the committed labs as fresh?"""
    assert cli.main(["build-labs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_unknown_benchmark():
    """Does an unknown benchmark name list the valid ones?"""
    with pytest.raises(ValueError, match="choose one of .*data"):
        labs.run_benchmark("nope")


def test_a_tooling_verb_says_where_it_went_without_the_tooling(monkeypatch, capsys):
    """In the learner image (no coursetools), does `labkit build-labs` keep its name
    and say how to get the tooling, instead of argparse's 'invalid choice'?"""
    monkeypatch.setitem(sys.modules, "coursetools", None)   # import fails, as there
    assert cli.main(["build-labs", "--check"]) == 2
    err = capsys.readouterr().err
    assert "course tooling (coursetools)" in err and "pip install -e tooling" in err


def test_the_command_names_every_tooling_verb():
    """Are the verbs `labkit` keeps for the tooling exactly the tooling's verbs?"""
    from coursetools import cli as tooling

    assert cli.TOOLING_VERBS == tooling.VERBS


def test_prepare_from_a_folder(tmp_path, capsys):
    """Does `labkit data prepare --from FOLDER` fill a fresh folder offline?"""
    from labkit import data

    given = str(data.data_root() / "MNIST" / "raw")
    assert cli.main(["data", "prepare", "--root", str(tmp_path), "--offline",
                     "--from", given]) == 0
    assert "MD5 verified" in capsys.readouterr().out
