"""The header's ``**Time:**`` sentence of a translated edition, in its language.

Taught in: nowhere (course tooling; coursetools.i18n writes it into each translated
header). The time model is the English edition's (coursetools.times): reading, the
given code, the Predict questions, the exercises' estimates and the measured compute.
All but the reading are the same in every edition (the same code, questions and
exercises, measured once); the reading is not: a Chinese learner reads the Chinese
text, so its minutes come from that text's length at a reading rate for Chinese.

Chinese is counted in 字: each Chinese character, and each Latin word or number (an
API name, ``GiB``, ``4096``) as one. ``CHARACTERS_PER_MINUTE`` is an estimate, not a
measurement with readers: 230 字 a minute for technical Chinese read to learn it, the
English edition's 140 words a minute at this course's 1.64 字 per English word
(32,589 字 for 19,840 words over the ten labs' core paths, counted 2026-12-01);
Brysbaert (2019, J. Mem. Lang. 109:104047) finds that reading rates across languages
follow how many words each needs for the same message. It sits well below the 500
字 a minute that China's compulsory-education curriculum standard for Chinese
(义务教育语文课程标准) asks of grade 7-9 pupils for silent reading of ordinary modern
prose, which technical text read to learn it does not reach.
"""

import math
import re

from coursetools import times

__all__ = ["CHARACTERS_PER_MINUTE", "TOKEN", "characters", "reading_minutes", "machine",
           "time_sentence", "WORDING"]

CHARACTERS_PER_MINUTE = {"zh_CN": 230}
TOKEN = "{{labkit.time}}"     # where a catalog's header entry wants the sentence
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z0-9_]+(?:[.'’-][A-Za-z0-9_]+)*")

# The sentence's wording per language: the parts of times.time_sentence, in order.
WORDING = {"zh_CN": {
    "sentence": "**时间：** {total}：{parts}。{honesty}",
    "join": "，",
    "estimate": "约 {n} 分钟（估计）", "estimate_plus": "约 {n} 分钟，另加计算时间",
    "reading": "阅读 {n} 分钟（中文 {words} 字，按每分钟 {wpm} 字计）",
    "code": "读给定代码 {n} 分钟（{what}）", "code_join": "；",
    "modules": "模块 {lines} 行，按每分钟 {rate} 行计",
    "cells": "单元格中 {lines} 行，按每分钟 {rate} 行计",
    "predict": "预测 {n} 分钟（{count} 个问题，每个 {each} 分钟）",
    "exercises": "练习 {n} 分钟（各练习标题中的估计）",
    "measured": "计算 {n} 分钟（完整模式，{date} 在 {on}上测得{shared}{quick}）",
    "shared": "，当时机器与其他任务共用，负载 {load:.0f}",
    "quick": "；快速模式 {q:.0f} 秒",
    "unmeasured": "计算时间尚未测量（`labkit measure-labs`）",
    "honesty": "字数、行数和计算时间是数出来或测出来的；速率和练习时间是估计。",
    "room": "**时间：** 约 {n} 分钟，在一个课堂里测得：{learners} 位学员"
            "从准备单元格到最后一个检查所用时间的中位数（{low}–{high} 分钟，"
            "{date}）；模型原来的估计是 {estimate} 分钟。",
    "appendix": "附录另有约 {n} 分钟的阅读，供自学。"}}

# How a measurement's machine ("2 CPU cores", "1 × NVIDIA H200") reads in a language.
_MACHINE = {"zh_CN": [(re.compile(r"^(\d+) CPU cores?$"), r"\1 个 CPU 核"),
                      (re.compile(r"^(\d+) × (.+)$"), r"\1 块 \2")]}


def characters(text: str) -> int:
    """Count ``text`` in 字: Chinese characters, plus Latin words and numbers."""
    return len(_HAN.findall(text)) + len(_LATIN.findall(text))


def _counts(english, translated, lang: str) -> tuple[int, int]:
    """(core, appendix) 字 of the translation's markdown, split where the English
    notebook's appendix begins (the same cells, by id); the Time sentence itself, once
    written, is not counted (so that writing it changes nothing)."""
    label = re.escape(WORDING[lang]["sentence"].split(" ", 1)[0])   # **时间：**
    sentence = re.compile(label + r".*?(?=\s*\*\*|\Z)|" + re.escape(TOKEN), re.S)
    in_core = {cell.get("id") for cell in times._core(english)}
    counted = [0, 0]
    for cell in translated.cells:
        if cell.cell_type == "markdown":
            counted[cell.get("id") not in in_core] += characters(
                sentence.sub("", cell.source))
    return counted[0], counted[1]


def reading_minutes(english, translated, lang: str) -> dict:
    """Return the translation's reading: core 字, core and appendix minutes."""
    core, appendix = _counts(english, translated, lang)
    rate = CHARACTERS_PER_MINUTE[lang]
    return {"chars": core, "reading": math.ceil(core / rate),
            "appendix": math.ceil(appendix / rate) if appendix else 0}


def machine(on: str, lang: str) -> str:
    """The measurement's machine in ``lang`` (as recorded when no rule matches), with
    the space that separates it from a following Chinese word when it ends in Latin
    letters or digits ("在 1 块 NVIDIA H200 上", "在 2 个 CPU 核上")."""
    for pattern, replacement in _MACHINE.get(lang, []):
        if pattern.match(on):
            on = pattern.sub(replacement, on)
            break
    return on + " " if on[-1:].isascii() and on[-1:].isalnum() else on


def time_sentence(english, lang: str, translated=None) -> str:
    """Return the ``**Time:**`` sentence of ``translated`` (the ``lang`` notebook made
    from the English one; without it, the English notebook's own text is counted):
    the English edition's model (coursetools.times), its reading counted here."""
    if lang not in WORDING:
        return times.time_sentence(english)       # no wording for it yet: English
    read = reading_minutes(english, translated or english, lang)
    wording = dict(WORDING[lang], machine=lambda on: machine(on, lang))
    return times.time_sentence(english, wording, reading={
        "minutes": read["reading"], "appendix": read["appendix"],
        "count": read["chars"], "rate": CHARACTERS_PER_MINUTE[lang]})
