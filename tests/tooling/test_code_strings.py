"""coursetools.code_strings: the learner-facing words of a code cell, found and
written back translated, the code still valid."""

import ast

import pytest

from coursetools import code_strings as cs

CELL = '''%%writefile demo.py
"""Lab 99: a module the ranks import."""
import torch


def step(ctx, x):
    """One step; returns the loss."""
    if x is None:
        raise ValueError(f"no input on rank {ctx.rank}: pass a tensor")
    return x


print(f"rank {rank}: loss {loss:.3f} after {steps} steps")
print("accuracy " + f"{acc:.1%}" + " on the test set")
ax.set_title("Gantt chart, 2 ranks")
ax.plot(xs, ys, label="measured")
labkit.reveal(guess, measured=m, what="the speed-up of 2 ranks")
print(result["name"], f"{x:.2f}")
print("Hello, {name}!".format(name=who))
msg = ("not shown: a plain assignment")
print(f"{len(fns)} functions but {len(args)} tuples: "
      "give one {tuple} per function")
'''


def _texts(source):
    return [lit.text for lit in cs.strings(source)]


def test_finds_what_prints_plots_and_documents():
    """Does it find prints, raise messages, labels, docstrings, and nothing else?"""
    assert _texts(CELL) == [
        "Lab 99: a module the ranks import.",
        "One step; returns the loss.",
        "no input on rank {ctx.rank}: pass a tensor",
        "rank {rank}: loss {loss:.3f} after {steps} steps",
        "accuracy ", " on the test set",
        "Gantt chart, 2 ranks",
        "measured",
        "the speed-up of 2 ranks",
        "Hello, {name}!",
        "{len(fns)} functions but {len(args)} tuples: give one {{tuple}} per function",
    ]


def test_replace_keeps_the_code_valid_and_the_quotes():
    """Translated in place: does the cell still parse, with each literal requoted?"""
    translations = {
        "rank {rank}: loss {loss:.3f} after {steps} steps":
            "rank {rank}：{steps} 步之后损失为 {loss:.3f}",
        "Gantt chart, 2 ranks": "甘特图，2 个 rank",
        "{len(fns)} functions but {len(args)} tuples: give one {{tuple}} per function":
            "{len(fns)} 个函数，却有 {len(args)} 个元组：每个函数给一个 {{tuple}}",
        "One step; returns the loss.": "一步；返回损失。",
    }
    out = cs.replace(CELL, translations)
    ast.parse(out.replace("%%writefile demo.py", ""))
    assert 'print(f"rank {rank}：{steps} 步之后损失为 {loss:.3f}")' in out
    assert 'ax.set_title("甘特图，2 个 rank")' in out
    assert '"""一步；返回损失。"""' in out
    assert 'print(f"{len(fns)} 个函数，却有 {len(args)} 个元组：每个函数给一个 {{tuple}}")' in out
    assert 'print("accuracy " + f"{acc:.1%}"' in out          # untranslated: unchanged
    assert _texts(out)[3] == "rank {rank}：{steps} 步之后损失为 {loss:.3f}"


@pytest.mark.parametrize("translation, problem", [
    ("rank：{steps} 步之后损失为 {loss:.3f}", "changed its fields"),
    ("rank {rank}：{steps} 步之后损失为 {loss}", "changed its fields"),
    ('rank {rank}："{steps}" 步 {loss:.3f}', "contains its quote"),
    ("rank {rank}：\n{steps} 步 {loss:.3f}", "breaks its one-line string"),
])
def test_a_translation_that_would_break_the_code_is_refused(translation, problem):
    """Lost or changed fields, a stray quote, a newline in a one-line string?"""
    (lit,) = [x for x in cs.strings(CELL) if x.text.startswith("rank {rank}")]
    assert problem in cs.field_problem(lit.text, translation, lit)
    assert cs.field_problem(lit.text, "rank {rank}：{steps} 步 {loss:.3f}", lit) is None
