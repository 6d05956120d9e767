"""coursetools.quoted_outputs: what the Chinese text quotes of the labs' output is what
the Chinese run prints (labkit's messages from labkit.po, the cells' prints from the
labs' catalogs)."""

from pathlib import Path

import nbformat
import pytest

from coursetools import i18n
from coursetools import quoted_outputs as qo

ROOT = Path(__file__).resolve().parents[2]
LANGS = sorted({lang for lang, _stem, _path in i18n.catalogs(ROOT / "locale")})
PAIRS = [("[launch] still running after {seconds:.0f} s:",
          "[launch] 已运行 {seconds:.0f} 秒，仍未结束："),
         ("Real shaped link: needs root, skipped ({reason}).",
          "真实的限速链路：需要 root 权限，已跳过（{reason}）。"),
         ("rank {rank}: loss {loss:.3f}", "rank {rank}：损失 {loss:.3f}")]
RENDERED = [(qo._rendered(en), qo._rendered(zh)) for en, zh in PAIRS]


@pytest.mark.parametrize("text, problem", [
    ("查看 `[launch] still running` 的输出。", "[launch] still running"),
    ("没有 root 权限时显示“needs root, skipped”。", "needs root, skipped"),
    ('输出 "rank 0: loss 0.125" 这样的行。', "rank 0: loss 0.125"),
])
def test_an_english_quote_of_the_output_is_a_problem(text, problem):
    """Does a Chinese text quoting an English line fail, saying what is printed?"""
    (found,) = qo.problems(text, RENDERED)
    assert problem in found and "the translated run prints" in found


@pytest.mark.parametrize("text", [
    "查看 `[launch] 已运行 N 秒，仍未结束` 的输出。",
    "没有 root 权限时显示“需要 root 权限，已跳过”。",
    "输出 `rank 1：损失 0.3` 这样的行。",
    "调用 `dist.all_reduce(t)`，再看 `torch.cuda.is_available()`。",   # code, no output
    "报错 `Connection closed by peer`（gloo 的原话）。",                 # torch's own words
])
def test_a_quote_of_the_translated_output_or_of_code_passes(text):
    """Are the translated lines, code and third-party messages left alone?"""
    assert qo.problems(text, RENDERED) == []


def test_a_code_span_may_become_the_translated_output_and_nothing_else():
    """May a translation replace a code span quoting an output by the translated
    output's quote (and only by that)?"""
    english = "Look for `[launch] still running` lines and `launch.run`."
    good = "留意 `[launch] 已运行 N 秒，仍未结束` 的报告和 `launch.run`。"
    bad = "留意 `[launch] 仍在运行` 的报告和 `launch.run`。"
    assert i18n.fidelity_problem(english, good, RENDERED) is None
    assert "[launch] still running" in i18n.fidelity_problem(english, bad, RENDERED)
    no_outputs = i18n.fidelity_problem(english, good)
    assert "[launch] still running" in no_outputs
    lost = "留意 `[launch] 已运行 N 秒，仍未结束` 的报告。"
    assert "launch.run" in i18n.fidelity_problem(english, lost, RENDERED)


@pytest.mark.parametrize("lang", LANGS)
def test_the_translated_text_quotes_what_the_translated_run_prints(lang):
    """Does every quote of a printed line in the translated labs' text match what the
    translated labkit and cells print? (And does the text quote some: the check is
    not empty.)"""
    locale = ROOT / "locale"
    pairs = qo.outputs(locale, lang, i18n.runtime_catalog(locale, lang))
    translated = [tr for _en, tr in pairs]
    found, quoting = [], 0
    for path in sorted((ROOT / "solutions" / lang).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            found += [f"{path.name} cell {cell.get('id')}: {problem}"
                      for problem in qo.problems(cell.source, pairs)]
            quoting += sum(bool(qo.quoted(q, translated)) and
                           not qo.quoted(q, [en for en, _tr in pairs])
                           for q in qo.quotes(cell.source))
    assert found == []
    # Labs 06, 07 and 09 quote translated lines (issue 27): the scan must see them.
    assert quoting >= 3, f"only {quoting} quotes of translated output: a blind scan?"
