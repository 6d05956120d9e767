"""INSTRUCTORS.md in Chinese, from one catalog that cannot drift (coursetools.guides)"""

import shutil
from pathlib import Path

import nbformat
import polib
import pytest

from coursetools import guides, times, tracks

ROOT = Path(__file__).resolve().parents[2]
ENGLISH = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
CATALOG = ROOT / "locale" / "zh_CN" / "LC_MESSAGES" / "INSTRUCTORS.po"


@pytest.fixture(scope="module")
def notebooks():
    found = {p.name: nbformat.read(p, as_version=4)
             for p in sorted((ROOT / "solutions").glob("*.ipynb"))}
    for nb in found.values():
        times.apply_header(nb)
    return found


def _titles(notebooks):
    return guides._titles(ROOT / "solutions", "zh_CN", notebooks)


def test_the_parts_put_back_together_are_the_english():
    found, blocks = guides.parts(ENGLISH)
    keys = [key for key, _text, _sep in found if key]
    assert len(keys) == len(set(keys)) > 30
    rebuilt = "".join(blocks[int(text.split(":")[1].rstrip("}"))] + sep[1:]
                      if key is None else text + sep for key, text, sep in found)
    assert rebuilt == ENGLISH
    assert {"running-the-room 0", "tracks 0", "how-long-each-lab-takes 0"} <= set(keys)


def test_the_committed_guide_is_the_catalog_built(notebooks):
    guide, problems = guides.translated_guide(ENGLISH, polib.pofile(str(CATALOG)),
                                              "zh_CN", notebooks, _titles(notebooks),
                                              CATALOG)
    assert problems == []
    assert (ROOT / "INSTRUCTORS.zh-CN.md").read_text(encoding="utf-8") == guide
    for heading in ("## 每个实验需要多长时间", "## 课程安排", "## 组织课堂"):
        assert heading in guide


def test_the_tables_are_chinese_with_the_english_numbers(notebooks):
    guide = (ROOT / "INSTRUCTORS.zh-CN.md").read_text(encoding="utf-8")
    assert "| 实验 | 阅读（分钟） |" in guide and "| 开始 | 内容 | 分钟 |" in guide
    assert "| 课程安排 | 讲授的实验 |" in guide and "1 天工作坊：从数据并行到分片" in guide
    for nb in notebooks.values():
        estimate = times.minutes(nb)["estimate"]
        assert f"**{estimate}**" in guide
    english_ends = [line.split("ends ")[1].split(" |")[0]
                    for line in ENGLISH.splitlines() if "× 9:00–17:00, ends" in line]
    chinese_ends = [line.split("结束于 ")[1].split(" |")[0]
                    for line in guide.splitlines() if "结束于 " in line]
    assert english_ends == chinese_ends and len(english_ends) == len(tracks.TRACKS)


def test_a_changed_english_part_turns_fuzzy_and_keeps_the_english(tmp_path,
                                                                  notebooks):
    catalog = tmp_path / "INSTRUCTORS.po"
    shutil.copy(CATALOG, catalog)
    changed = ENGLISH.replace("is the guide: Kubernetes",
                              "is the whole guide: Kubernetes")
    counts = guides.update(catalog, changed, "zh_CN")
    assert counts["fuzzy"] == 1 and counts["new"] == 0
    guide, problems = guides.translated_guide(changed, polib.pofile(str(catalog)),
                                              "zh_CN", notebooks, _titles(notebooks),
                                              catalog)
    assert [p.cell for p in problems] == ["running-the-room 2"]
    assert "fuzzy" in str(problems[0]) and "INSTRUCTORS.md" in str(problems[0])
    assert "is the whole guide: Kubernetes" in guide        # the English, until translated
    assert "## 组织课堂" in guide                      # the rest stays Chinese


def test_a_new_track_without_its_chinese_name_is_a_problem(notebooks, monkeypatch):
    renamed = {"3-day workshop" if name == "2-day workshop" else name: days
               for name, days in tracks.TRACKS.items()}
    monkeypatch.setattr(tracks, "TRACKS", renamed)
    _guide, problems = guides.translated_guide(
        ENGLISH, polib.pofile(str(CATALOG)), "zh_CN", notebooks, _titles(notebooks),
        CATALOG)
    assert any("'3-day workshop' has no translation" in str(p) for p in problems)
