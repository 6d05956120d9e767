"""A way past every failure, and grading that cannot be passed on the references.

What every check shares (``labkit.checks``): each failure ends with the reference line,
a pass is recorded with whose code passed, ``checks.solved`` gives later cells the
exercise as its check left it, a graded run (``LABKIT_GRADED=1``) gives no pass on a
reference, and a graded image's locked references hand nothing out. The notebooks'
side (every lab, every exercise, in a real kernel) is tests/course/test_reference_switch.py;
real nbgrader is tests/course/test_nbgrader.py.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.checks import ExerciseFailed, _verdicts, _reference

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r'`checks\.use_reference\("(\w+(?:\.py)?)"\)`$')

# A notebook's cells, run in a namespace of their own (as the kernel's __main__).
SETUP = "from labkit.labs.environment import checks\n"
RIGHT = ("def count_parameters(model):\n"
         "    return sum(p.numel() for p in model.parameters() if p.requires_grad)\n")
WRONG = ("def count_parameters(model):\n"
         "    return sum(p.numel() for p in model.parameters())\n")
RAISES = ("def count_parameters(model):\n"
          "    return model.no_such_attribute\n")
CHECK = "checks.count_parameters(count_parameters)\n"


@pytest.fixture
def notebook(monkeypatch):
    """A fresh notebook namespace; run(cells) runs code in it."""
    monkeypatch.setattr(_verdicts, "_PASSED", {})
    monkeypatch.setattr(_reference, "_PUT", {})
    monkeypatch.delenv("LABKIT_GRADED", raising=False)
    namespace = {"__name__": "__main__"}
    exec(SETUP, namespace)

    def run(*cells):
        for cell in cells:
            exec(compile(cell, "<cell>", "exec"), namespace)
        return namespace
    return run


def _failure(run, *cells) -> str:
    with pytest.raises(ExerciseFailed) as failed:
        run(*cells)
    return str(failed.value)


def test_a_wrong_result_and_an_exception_end_with_the_reference_line(notebook):
    """Not only the stub: does a wrong answer, and an exception in the learner's code,
    end with the reference line (the exception with the learner's own line)?"""
    wrong = _failure(notebook, WRONG, CHECK)
    assert "expected 12, got 67" in wrong and "not done yet" not in wrong
    assert LINE.search(wrong).group(1) == "count_parameters"
    raised = _failure(notebook, RAISES, CHECK)
    assert "your code raised AttributeError" in raised and "In your code" in raised
    assert "in count_parameters" in raised
    assert LINE.search(raised).group(1) == "count_parameters"


def test_a_pass_is_recorded_until_the_code_changes_or_fails(notebook, capsys):
    """Does has_passed follow the last verdict on the code as it is now?"""
    ns = notebook(RIGHT, CHECK, "a = checks.has_passed('count_parameters')")
    assert ns["a"] is True and "(on labkit's REFERENCE" not in capsys.readouterr().out
    ns = notebook(RIGHT, "b = checks.has_passed('count_parameters')")   # redefined
    assert ns["b"] is False
    notebook(CHECK)
    _failure(notebook, WRONG, CHECK)
    assert notebook("c = checks.has_passed('count_parameters')")["c"] is False


def test_solved_gives_yours_once_passed_else_the_reference_and_says_so(notebook,
                                                                      capsys):
    """Does solved() return the learner's passing function silently, and in place of a
    failed one labkit's reference, in one line naming the exercise?"""
    ns = notebook(RIGHT, CHECK, "mine = count_parameters",
                  "got = checks.solved('count_parameters')")
    assert ns["got"] is ns["mine"] and "REFERENCE" not in capsys.readouterr().out
    _failure(notebook, WRONG, CHECK)
    ns = notebook("wrong = count_parameters",
                  "count_parameters = checks.solved('count_parameters')")
    out = capsys.readouterr().out
    assert "Exercise 0.1" in out and "has not passed on your `count_parameters`" in out
    assert ns["count_parameters"] is not ns["wrong"]
    from torch import nn

    frozen = nn.Sequential(nn.Linear(10, 5), nn.Linear(5, 2))
    frozen[0].requires_grad_(False)
    assert ns["count_parameters"](frozen) == 12   # the reference counts right


def test_a_pass_on_the_reference_says_so(notebook, capsys):
    """After the line is taken, does the check pass, saying it is the reference's?"""
    notebook(WRONG, "checks.use_reference('count_parameters')", CHECK)
    out = capsys.readouterr().out
    assert "✅ count_parameters: passed" in out and "on labkit's REFERENCE" in out
    ns = notebook("x = checks.solved('count_parameters')")
    assert "REFERENCE `count_parameters`" in capsys.readouterr().out
    assert ns["x"] is ns["count_parameters"]


def test_a_graded_run_gives_no_pass_on_the_reference(notebook, monkeypatch):
    """With LABKIT_GRADED=1, does a check fail on the reference (and only there)?"""
    monkeypatch.setenv("LABKIT_GRADED", "1")
    failure = _failure(notebook, "checks.use_reference('count_parameters')", CHECK)
    assert "a graded course gives it no points" in failure
    assert notebook("p = checks.has_passed('count_parameters')")["p"] is False
    notebook(RIGHT, CHECK)   # the learner's own code still passes
    assert notebook("p = checks.has_passed('count_parameters')")["p"] is True


def test_a_program_on_the_reference_is_told_from_yours(notebook, tmp_path,
                                                      monkeypatch, capsys):
    """A program exercise: the same check passes on the learner's file as theirs and
    on the reference labkit put in place as the reference's; solved() then puts the
    reference back over a file changed since."""
    monkeypatch.chdir(tmp_path)
    ex = _reference.exercise_for(key="parallel_apply.py")
    Path("parallel_apply.py").write_text(ex["source"] + "\n")   # as %%writefile does
    ns = notebook("from labkit.labs.data_parallel import checks as dp",
                  "dp.parallel_apply('parallel_apply.py')",
                  "mine = dp.has_passed('parallel_apply.py')")
    assert ns["mine"] and "REFERENCE" not in capsys.readouterr().out
    notebook("dp.use_reference('parallel_apply.py')", "dp.parallel_apply()")
    assert "on labkit's REFERENCE" in capsys.readouterr().out
    Path("parallel_apply.py").write_text("def parallel_apply(fns, args):\n"
                                         "    return []\n")
    ns = notebook("module = dp.solved('parallel_apply.py')")
    assert "has not passed on your `parallel_apply.py`" in capsys.readouterr().out
    assert Path("parallel_apply.py").read_text() == ex["source"]
    assert "return []" in Path("parallel_apply.py.mine").read_text()
    assert ns["module"].parallel_apply([abs], [(-2,)]) == [2]


@pytest.fixture
def locked(tmp_path, monkeypatch):
    """labkit's rooms with their references locked, as in a graded image."""
    rooms = tmp_path / "labs"
    for store in (ROOT / "labkit" / "labs").glob("*/reference.json"):
        (rooms / store.parent.name).mkdir(parents=True)
        shutil.copy(store, rooms / store.parent.name / store.name)
    monkeypatch.setattr(_reference, "_ROOMS", rooms)
    _reference._stores.cache_clear()
    _reference.lock(rooms)
    yield rooms
    _reference._stores.cache_clear()


def test_locked_references_keep_the_index_and_hand_nothing_out(locked, notebook):
    """In a graded image: does use_reference refuse, a failing check offer no line, and
    a cell building on an exercise that has not passed fail naming it?"""
    store = json.loads((locked / "environment" / "reference.json").read_text())
    assert [e["key"] for e in store["exercises"]][0] == "count_parameters"
    assert not any("source" in e for e in store["exercises"])
    with pytest.raises(_reference.NoReference, match="graded course"):
        notebook("checks.use_reference('count_parameters')")
    failure = _failure(notebook, WRONG, CHECK)
    assert "expected 12" in failure and "use_reference" not in failure
    with pytest.raises(ExerciseFailed, match="Exercise 0.1.*no reference solution"):
        notebook("checks.solved('count_parameters')")
    notebook(RIGHT, CHECK, "f = checks.solved('count_parameters')")   # yours: fine


def test_the_graded_image_locks_the_references_before_installing(tmp_path):
    """Does the Dockerfile's graded step, run here with GRADED=1 on a copy of the
    course, lock every room's references (the index kept, no solved code)?"""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG GRADED=0" in dockerfile and "LABKIT_GRADED=${GRADED}" in dockerfile
    run = re.search(r'RUN (if \[ "\$\{GRADED\}" = "1" \]; then.*?fi) \\\n\s*&& pip install',
                    dockerfile, re.DOTALL)
    assert run, "the graded RUN step must lock the references before pip install"
    course = tmp_path / "course"
    shutil.copytree(ROOT / "labkit", course / "labkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = run.group(1).replace("\\\n", " ")
    env = dict(os.environ, GRADED="1", COURSE_DIR=str(course),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    stores = sorted((course / "labkit" / "labs").glob("*/reference.json"))
    assert len(stores) == len(list((ROOT / "labkit" / "labs").glob("*/reference.json")))
    for store in stores:
        exercises = json.loads(store.read_text())["exercises"]
        assert exercises and all("key" in e and "source" not in e for e in exercises)
    assert "source" in json.loads((ROOT / "labkit" / "labs" / "ddp" /
                                   "reference.json").read_text())["exercises"][0]


def test_a_check_takes_an_earlier_exercise_as_its_check_left_it(notebook, tmp_path,
                                                                monkeypatch, capsys):
    """prerequisite (2.2's check loading 2.1's parallel_apply): as it is while 2.1's
    check never ran here, labkit's reference once that check has failed."""
    from course.wrong_solutions import wrong_source
    from labkit.checks._solved import prerequisite

    monkeypatch.chdir(tmp_path)
    ex = _reference.exercise_for(key="parallel_apply.py")
    wrong = wrong_source(ex["key"], ex["source"])
    Path("parallel_apply.py").write_text(wrong)
    prerequisite("parallel_apply.py")
    assert Path("parallel_apply.py").read_text() == wrong
    failure = _failure(notebook, "from labkit.labs.data_parallel import checks as dp",
                       "dp.parallel_apply('parallel_apply.py')")
    assert LINE.search(failure).group(1) == "parallel_apply.py"
    module = prerequisite("parallel_apply.py")
    assert "has not passed on your `parallel_apply.py`" in capsys.readouterr().out
    assert Path("parallel_apply.py").read_text() == ex["source"]
    assert module.parallel_apply([abs, abs], [(-1,), (-2,)]) == [1, 2]
