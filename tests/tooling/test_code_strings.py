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


FOUND_BY_USE = '''verdict = "fits" if need <= gib else "does NOT fit"
device = "cuda" if ok else "cpu"
print(f"one {name}: {verdict}")
x = torch.ones(1, device=device)
print(f"{'model':>10}" + "  ".join(f"{'fits' if n < g else 'no':>9}" for g in gpus))
for label, m in [(f"plain step, {n} images", a), ("  of which replication", b)]:
    print(f"{label:32}: {m:.2f} ms")
for key, m in [("kept as a key", a)]:
    results[key] = m


def summary(ms):
    return f"median {ms:.2f} ms"


print(f"whole model: {summary(single)}")
assert gap < 1e-6, "the split must equal the whole"
labkit.reveal(g, measured="- (nothing to measure)", unit="points", what="lost")
ax.legend(["measured", "model"])
warnings.warn("slow on a shared machine")
'''


def test_finds_what_reaches_the_learner_through_names_and_fields():
    """Strings the cell shows through a variable, a loop over a literal list, a
    function's result, an f-string's field, an assert, reveal's other keywords, a
    legend's list and a warning: found, and a name that code also uses is not?"""
    texts = _texts(FOUND_BY_USE)
    for shown in ["fits", "does NOT fit", "one {name}: {verdict}", "model", "no",
                  "plain step, {n} images", "  of which replication",
                  "median {ms:.2f} ms", "whole model: {summary(single)}",
                  "the split must equal the whole", "- (nothing to measure)",
                  "points", "lost", "measured", "slow on a shared machine"]:
        assert shown in texts, shown
    for code in ["cuda", "cpu", "kept as a key"]:        # device= and results[key]
        assert code not in texts, code


def test_a_field_literal_is_translated_inside_its_f_string():
    """A literal in an f-string's field: written there, the f-string's own
    translation keeping the field verbatim; a quote in it is refused."""
    out = cs.replace(FOUND_BY_USE, {"fits": "放得下", "no": "放不下", "model": "模型"})
    assert "f\"{'放得下' if n < g else '放不下':>9}\"" in out
    assert "print(f\"{'模型':>10}\"" in out
    assert 'verdict = "放得下" if need <= gib else "does NOT fit"' in out
    ast.parse(out)
    (fits,) = [lit for lit in cs.strings(FOUND_BY_USE) if lit.text == "no"]
    assert fits.nested and "quote" in cs.field_problem("no", "'否'", fits)


def test_braces_of_a_docstring_are_text_not_fields():
    """A docstring's {…} is prose: its translation may reword it; an f-string's may
    not."""
    source = ('def f():\n    """Return {name: median seconds}."""\n'
              'print(f"{n} seconds")\n')
    doc, printed = cs.strings(source)
    assert not doc.formatted and printed.formatted
    assert cs.field_problem(doc.text, "返回 {名字: 中位秒数}。", doc) is None
    assert "fields" in cs.field_problem(printed.text, "{m} 秒", printed)


def test_a_translation_that_does_not_parse_is_named():
    """syntax_problem: the safety net build-labs applies to a translated cell."""
    assert cs.syntax_problem("%%writefile a.py\nprint('x')\n!ls\n") is None
    assert "line 1" in cs.syntax_problem("print('x'\n")


def test_what_a_shell_line_echoes_is_found_and_written_back():
    """`!cmd || echo "..."`: its words are the learner's too; IPython's {fields} in
    it stay, and a translation may not hold the shell's quote."""
    source = '!nvidia-smi || echo "no driver here: the labs use {n} CPU ranks"\nx = 1\n'
    (lit,) = cs.strings(source)
    assert lit.text == "no driver here: the labs use {n} CPU ranks" and lit.quote == '"'
    out = cs.replace(source, {lit.text: "这里没有驱动：实验使用 {n} 个 CPU rank"})
    assert out.startswith('!nvidia-smi || echo "这里没有驱动：实验使用 {n} 个 CPU rank"\n')
    assert "contains its quote" in cs.field_problem(lit.text, '没有 "{n}"', lit)
