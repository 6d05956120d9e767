"""TERMINOLOGY.md is the one glossary of every Chinese catalog (coursetools.terms)."""

from pathlib import Path

import polib
import pytest

from coursetools import terms

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "TERMINOLOGY.md"
CATALOGS = sorted((ROOT / "locale").glob("*/LC_MESSAGES/*.po")) + sorted(
    (ROOT / "labkit" / "locale").glob("*/LC_MESSAGES/*.po"))


@pytest.fixture(scope="module")
def ruleset():
    return terms.rules(GLOSSARY)


def test_the_glossary_rules_out_the_forms_the_review_found(ruleset):
    ruled = {rule.form for rule in ruleset}
    # issue 27, item 4: labkit.po and the notebooks disagreed on these
    assert {"block", "stage", "mesh", "style", "计划", "checkpoint", "下标", "梯度累加",
            "千兆字节", "挂起", "精度"} <= ruled
    accuracy = next(rule for rule in ruleset if rule.form == "精度")
    assert accuracy.term == "准确率" and "混合精度" in accuracy.exceptions


@pytest.mark.parametrize("catalog", CATALOGS, ids=lambda p: p.name)
def test_no_catalog_uses_a_ruled_out_form(catalog, ruleset):
    found = terms.catalog_uses(catalog, ruleset)
    assert not found, "\n".join(map(str, found))


def _ids(text, ruleset):
    return [(rule.form, word) for rule, word in terms.uses(text, ruleset)]


def test_a_ruled_out_form_is_found_in_prose(ruleset):
    assert _ids("请对每个 block 单独做激活重计算。", ruleset) == [("block", "block")]
    assert ("stage", "stage") in _ids("stage {stage} 时，梯度已经分片。", ruleset)
    assert _ids("训练精度很高", ruleset) == [("精度", "精度")]
    assert len(_ids("这是本批次的梯度再加上（PLUS）上一步的梯度", ruleset)) == 1
    assert _ids("会让 DDP 挂起", ruleset) == [("挂起", "挂起")]


def test_a_ruled_out_form_is_allowed_where_the_english_stays(ruleset):
    allowed = [
        "调用 `torch.utils.checkpoint.checkpoint(block, x)`。",   # code span
        "没有检查点写到 cfg.checkpoint（{path}）",                 # identifier
        "用 block_plan() 在 mesh=mesh 上调用，tp.Block 也一样",    # identifiers
        "它会警告 'got mixed torch.Tensor and DTensor'",           # quoted message
        "复制（“暂存”，stage）到 CPU 内存中",                      # gloss
        "{style} 的默认值正是这个块需要的",                         # a field
        "混合精度下的 Adam；半精度",                                # exceptions
        "设备网格的最后一维；分布式检查点（DCP）",
    ]
    for text in allowed:
        assert _ids(text, ruleset) == [], text


def test_a_use_names_the_catalog_the_entry_and_the_term(tmp_path, ruleset):
    po = polib.POFile()
    po.append(polib.POEntry(msgctxt="cell-7", msgid="x", msgstr="每个 block 一次"))
    po.append(polib.POEntry(msgctxt="cell-8 code", msgid="y", msgstr="检查点"))
    path = tmp_path / "07_x.po"
    po.save(str(path))
    found = terms.catalog_uses(path, ruleset)
    assert len(found) == 1
    message = str(found[0])
    assert "07_x.po" in message and "cell-7" in message and "'block'" in message
    assert "块" in message
