"""INSTRUCTORS.md in another language, from one catalog that cannot drift.

Taught in: nowhere (course tooling; locale/README.md is the translator's guide). The
English INSTRUCTORS.md stays the only source. Its translation is a gettext catalog,
``locale/<lang>/LC_MESSAGES/INSTRUCTORS.po``: one entry per heading, paragraph, list
item or table, ``msgctxt`` the section (its English heading) and the part's number in
it. The generated blocks (``<!-- lab-times: ... -->`` and the others) are not in the
catalog: ``labkit build-labs`` fills them in the catalog's language from the notebooks
(``coursetools.times``, ``tracks``, ``gpus``, with the wording below), as it does the
Time sentence, and writes ``INSTRUCTORS.<lang>.md`` (``zh_CN`` -> ``zh-CN``, as
README.zh-CN.md). ``labkit i18n update`` merges a changed English part as for the
notebooks (its entry turns fuzzy); ``build-labs --check`` fails on an entry that is
missing, fuzzy or untranslated, and on generated words (a track's name, a lab's
``gpus_why``) that the wording below does not translate.
"""

import re
from pathlib import Path

from coursetools import gpus, i18n, times, tracks
from coursetools.notebooks import refresh

__all__ = ["DOMAIN", "WORDING", "parts", "update", "translated_guide", "build_guides"]

DOMAIN = i18n.GUIDE_DOMAIN
_BLOCK = re.compile(r"^<!-- ([\w-]+): .*?-->\n.*?^<!-- /\1 -->\n?", re.M | re.S)
_TOKEN = "{{labkit.block:%d}}"
_ITEM = re.compile(r"^(?:- |\d+\. )")

# Each language's words for the generated tables (the keys of times.TABLE,
# tracks.WORDS and gpus.ADVICE); the numbers are the English edition's.
WORDING = {"zh_CN": {
    "machine": lambda on: re.sub(r"^(\d+) CPU cores?$", r"\1 个 CPU 核心", on),
    "times": {
        "header": "| 实验 | 阅读（分钟） | 给定代码（分钟：模块 + 单元格行数） | 预测（分钟："
                  "问题数） | 练习（分钟，估计） | 计算（分钟，实测） | 估计（分钟） | "
                  "你的课堂（分钟） | 附录（分钟） |",
        "row": "| {title} | {reading}（英文 {words} 词） | {code}（{modules} + {cells} "
               "行） | {predict}（{questions}） | {exercises} | {compute} | "
               "**{estimate}** | {room} | {appendix}（英文 {appendix_words} 词） |",
        "compute": "{n}（{full:.0f} 秒{quick}{load}）", "quick": "，快速模式 {q:.0f} 秒",
        "load": "，负载 {load:.0f}", "unmeasured": "尚未测量",
        "room": "**{n}**（{low:.0f}–{high:.0f}，{learners} 位学员）",
        "on": "\n计算时间在 {on} 上测得。\n"},
    "tracks": {
        "lab": "实验 {labs}：{title}（{minutes} + {explain} 分钟讲解）",
        "demo": "实验 {labs}，演示（快速模式）", "demos": "实验 {labs}，演示（快速模式）",
        "primer": "代替实验 {labs} 的入门短文：`{page}`",
        "appendices": "实验 {labs} 的附录（阅读、答疑）",
        "and": " 和 ", "break": "休息", "lunch": "午餐", "wrap-up": "总结与答疑",
        "day": "第 {n} 天：", "schedule_header": "| 开始 | 内容 | 分钟 |",
        "end": "结束（比 {close} 早 {spare} 分钟）",
        "shown": "；演示 {labs}", "primed": "；入门短文 {names}",
        "days": "{n} 天 × {start}–{close}，结束于 {ends}",
        "header": "| 课程安排 | 讲授的实验 | 学员用时（分钟） | 天数 | 每位学员的 GPU |",
        "self-study": "{labs}，含附录", "at your pace": "按自己的节奏",
        "tracks": {"1-day workshop: data parallelism to sharding":
                   "1 天工作坊：从数据并行到分片",
                   "1-day workshop: data parallelism to pipelines":
                   "1 天工作坊：从数据并行到流水线",
                   "2-day workshop": "2 天工作坊", "5-day course": "5 天课程",
                   "self-study": "自学"},
        "gpus": {
            "none": "不需要；有 1 块 GPU 时，每个单元格都在它上面运行",
            "need": "不需要（gloo，CPU rank）。要在每个多 rank 的单元格里看到 NCCL："
                    "{need}。只有 1 块 GPU 时完全看不到 NCCL（每个 rank 一块 GPU）",
            "group": "实验 {labs} 需要 {gpus} 块", "groups": "；",
            "header": "| 实验 | 每个单元格都在 GPU 上运行时，每位学员需要的 GPU | 原因 |",
            "why": {"the report shows a GPU and its topology": "报告会显示 GPU 及其拓扑",
                    "bf16 autocast timed": "为 bf16 autocast 计时",
                    "3 replicas on 3 GPUs": "3 块 GPU 上的 3 个副本",
                    "2 ranks": "2 个 rank", "FSDP2 at N = 4": "N = 4 时的 FSDP2",
                    "the 2 × 2 mesh": "2 × 2 设备网格",
                    "the 2 × 2 × 2 mesh": "2 × 2 × 2 设备网格"}}}}}


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lstrip("#").strip().lower()).strip("-")


def _chunks(text: str) -> list[str]:
    """Split at blank lines, keeping each separator; a fenced block stays whole."""
    pieces, merged = re.split(r"(\n[ \t]*\n+)", text), []
    for piece in pieces:
        if merged and merged[-1].count("```") % 2:
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged


def parts(text: str) -> tuple[list, list[str]]:
    """Return (parts, generated blocks) of a guide. A part is (key, text, separator):
    key None for a generated block's token, else ``"<section> <n>"``."""
    blocks = [m.group(0) for m in _BLOCK.finditer(text)]
    for number, block in enumerate(blocks):
        text = text.replace(block, _TOKEN % number + "\n", 1)
    found, section, count = [], "top", 0
    chunks = _chunks(text)
    for text_part, separator in zip(chunks[::2], chunks[1::2] + [""]):
        lines = text_part.split("\n")
        if text_part.startswith("#"):
            section, count = _slug(lines[0]), 0
        if text_part.startswith("{{labkit.block:"):
            found.append((None, text_part, separator))
            continue
        items = [[]]
        for line in lines:
            if _ITEM.match(line) and items[-1] and _ITEM.match(lines[0]):
                items.append([])
            items[-1].append(line)
        for index, item in enumerate(items):
            found.append((f"{section} {count}", "\n".join(item),
                          separator if index == len(items) - 1 else "\n"))
            count += 1
    return found, blocks


def update(po_path, english_text: str, lang: str) -> dict:
    """Merge INSTRUCTORS.md into its catalog (created if missing); return counts, as
    ``coursetools.i18n.update`` does for a notebook."""
    import polib

    po_path = Path(po_path)
    po = (polib.pofile(str(po_path)) if po_path.exists()
          else i18n._new_catalog(lang, DOMAIN))
    po.header = (f"{lang} translation of INSTRUCTORS.md (one entry per heading, "
                 "paragraph, list item or table; msgctxt = section and number).\n"
                 "Refresh with `labkit i18n update`; see locale/README.md.")
    by_key = {entry.msgctxt: entry for entry in po}
    entries, new = [], 0
    for key, text, _separator in parts(english_text)[0]:
        if key is None:
            continue
        entry = by_key.pop(key, None)
        if entry is None:
            entry, new = polib.POEntry(msgctxt=key, msgid=text, msgstr=""), new + 1
        i18n._merge(entry, text)
        entries.append(entry)
    return i18n._save_merged(po, po_path, entries, by_key.values(), new)


def _untranslated_words(notebooks: dict, wording: dict) -> list[str]:
    names = set(tracks.TRACKS) | {tracks.SELF_STUDY}
    whys = {nb.metadata.get("labkit", {}).get("gpus_why") for nb in notebooks.values()}
    return (sorted(names - set(wording["tracks"]["tracks"]))
            + sorted(whys - {None} - set(wording["tracks"]["gpus"]["why"])))


def translated_guide(english_text: str, po, lang: str, notebooks: dict,
                     titles: dict, po_path) -> tuple[str, list]:
    """Return (the guide in ``lang``, problems): each part from the catalog (the
    English where its entry cannot stand for it), the generated blocks in ``lang``."""
    found, blocks = parts(english_text)
    entries = {e.msgctxt: e for e in po if not e.obsolete}
    problems, out = [], []
    for key, text, separator in found:
        if key is None:
            out.append(blocks[int(re.search(r"\d+", text).group(0))] + separator[1:])
            continue
        entry = entries.pop(key, None)
        why = i18n._entry_problem(entry, text)
        if why:
            problems.append(i18n.Problem(Path(po_path), "INSTRUCTORS.md", key, why))
        out.append((text if why else entry.msgstr) + separator)
    problems += [i18n.Problem(Path(po_path), "INSTRUCTORS.md", key, "its part no "
                              "longer exists") for key in entries]
    wording = WORDING.get(lang)
    guide = "".join(out)
    if wording is None:
        return guide, problems
    problems += [i18n.Problem(Path(po_path), "INSTRUCTORS.md", "-", f"{word!r} has no "
                              "translation in coursetools.guides.WORDING")
                 for word in _untranslated_words(notebooks, wording)]
    guide = times.instructors_text(guide, notebooks, wording["times"],
                                   {n: t for n, t in titles.items()},
                                   wording["machine"])
    short = {name[:2]: title.split("—", 1)[-1].strip()
             for name, title in titles.items()}
    guide = tracks.instructors_text(guide, notebooks, words=wording["tracks"],
                                    titles=short)
    return guide, problems


def _titles(solutions_dir: Path, lang: str, english: dict) -> dict:
    """Each lab's title line in ``lang`` (its translated solution), else English."""
    import nbformat

    titles = {}
    for name, nb in english.items():
        path = solutions_dir / lang / name
        source = nbformat.read(path, as_version=4) if path.exists() else nb
        titles[name] = source.cells[0].source.splitlines()[0].lstrip("# ").strip()
    return titles


def build_guides(root, english_text: str, notebooks: dict, check: bool) -> list:
    """Write INSTRUCTORS.<lang>.md for every guide catalog; return the stale files
    and, when checking, the problems (else printed, as for the notebooks)."""
    import sys

    import polib

    root = Path(root)
    changed, problems = [], []
    for po_path in sorted((root / i18n.LOCALE).glob(f"*/LC_MESSAGES/{DOMAIN}.po")):
        lang = po_path.parent.parent.name
        guide, found = translated_guide(
            english_text, polib.pofile(str(po_path)), lang, notebooks,
            _titles(root / "solutions", lang, notebooks), po_path)
        problems += found
        refresh(root / f"INSTRUCTORS.{lang.replace('_', '-')}.md", guide, check,
                changed)
    if check:
        return changed + problems
    for problem in problems:
        print(f"labkit build-labs: English text kept: {problem}", file=sys.stderr)
    return changed
