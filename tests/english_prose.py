"""English prose in what a Chinese notebook shows: the rule, and what is read.

tests/chinese_outputs.py applies it to every cell of ``solutions/zh_CN`` as nbval runs
it. ``shown_texts`` is what JupyterLab shows of a cell's outputs: streams, errors
(name, value, and the traceback's own lines, not the code it quotes), markdown, HTML,
plain text (a figure's and a widget's words come from the kernel instead).
``english_runs`` is the rule: two or more English words in a row (a figure's or a
widget's label: one, when it has no Chinese at all), where a word is letters only;
code (anything with a digit, ``_``, ``.``, ``/``, ``=``, brackets), acronyms and
CamelCase names, and the words of ``ALLOWED`` (TERMINOLOGY.md's terms kept in
English, API, product and unit names) are not English prose. ``KEPT_VERBATIM`` lists
the third-party text a lab shows on purpose (torch's own errors, as TERMINOLOGY.md
keeps them), each with its reason.
"""

import bisect
import re

__all__ = ["ALLOWED", "KEPT_VERBATIM", "english_runs", "label_is_english",
           "shown_texts"]

# TERMINOLOGY.md's "Kept as is" and the English terms its tables keep; names of APIs,
# methods, systems and products; units. Lower case; a word in ALL CAPS (GPU, NCCL) or
# with an inner capital (DataParallel, ZeRO) is a name already.
ALLOWED = frozenset("""
rank ranks worker workers kernel kernels logits state dict tag tags notebook notebooks
gloo nccl mpi cpu cpus gpu gpus cuda torch pytorch python torchrun torchvision
jupyter jupyterlab labkit mnist all-reduce all-gather reduce-scatter all-to-all
allreduce rendezvous barrier quorum mesh shard replicate partial adam sgd
local gpipe megatron megatron-lm nvlink pcie infiniband ethernet linux docker slurm
kubernetes colab nvidia hopper ampere
gib mib kib gb mb kb tb ms us µs ns min s
vs x true false none et al
pythia llama resnet bert gpt mistral mixtral deepseek qwen transformer world
""".split())

# Third-party text a lab shows on purpose, verbatim (TERMINOLOGY.md: error messages
# and log lines stay as PyTorch, gloo and NCCL print them, so a learner can search
# for them). Each pattern matches the kept text itself, never a whole line.
KEPT_VERBATIM = [
    r"\S+: command not found",          # bash: `!nvidia-smi` where there is none
    r"\S+: \d+: \S+: not found",         # dash (CI's /bin/sh): the same, as dash says it
    # An exception or a warning as Python shows it, up to the end of its line: torch's,
    # gloo's and the standard library's own words (labkit's and the cells' are Chinese).
    r"\b[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt)\b(?:\(\S*\))?:.*",
    r"\bTraceback \(most recent call last\):",
    r"\bThread 0x[0-9a-f]+ \(most recent call first\):",     # faulthandler
    r"\bFile \"[^\"]+\", line \d+,? in \S+",                 # a stack frame
    r"\S+\.py(?::\d+|, line \d+)? in <?\w+>?",                  # a frame, in short
    # torch's (and torchrun's) log lines: [WEI]MMDD hh:mm:ss.us pid file:line] message
    r"\b[WEI]\d{4} [\d:.]+ \d+ \S+:\d+\] .*",
    # torch.utils.benchmark's Measurement, as print() shows it (lab 02)
    r"<\S+ object at 0x[0-9a-f]+>", r"\d+ measurements?, \d+ runs? per measurement.*",
    r"WARNING: Interquartile range is .*", r"This could indicate system fluctuation\.",
    r"This suggests significant environmental influence\.",
    r"\bException in thread \S+(?: \(\w+\))?:",      # threading's excepthook (lab 02)
    # load_state_dict's answers (lab 07, 09)
    r"<All keys matched successfully>", r"Error\(s\) in loading state_dict for \w+:",
    # jsonschema's messages on a TrainJob (lab 09)
    r"Additional properties are not allowed \(.*\)", r"'[^']*' is not of type '\w+'",
    # torch's own messages that lab 08's pitfalls print without their exception name
    r"\S+ is deprecated, use \S+ instead.*", r"c10d::\w+: an autograd kernel .*",
    r"\bPSF License Agreement\b",      # a licence's name, as the PSF writes it (lab 10)
]
# Lab 06's profiler labels (bottleneck.PHASES): the names its trace files carry, which
# the learner looks up in Perfetto; kept as they are, like the operators' names.
def _phases() -> tuple:
    """bottleneck.PHASES, read from its source (importing it would import torch)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = root / "labkit" / "labs" / "communication" / "bottleneck.py"
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if getattr(target, "id", "") == "PHASES":
            return ast.literal_eval(node.value)
    raise LookupError(f"no PHASES in {path}")


KEPT_VERBATIM += [rf"(?<![\w-]){re.escape(phase)}(?![\w-])" for phase in _phases()]
# The course's deployment files (English in both editions, like all code): a lab that
# prints one shows its lines as they are.
REPOSITORY_FILES = ["env/kubernetes/*.yaml", "env/slurm/*", "env/jupyterhub/*.yaml"]
_CODE_TUPLE = re.compile(r"\(\s*\w+(?:\s*,\s*\w+)+\s*\)")    # (dim, hidden), (dp, tp)

_CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")
_BREAK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef\n]+")
_SPAN = re.compile(r"`[^`\n]*`")
_URL = re.compile(r"\b(?:https?|file)://\S+")
_EDGES = "\"'“”‘’()[]{}<>,.;:!?…—–*#|"
_WORD = re.compile(r"[A-Za-z]+(?:['’-][A-Za-z]+)*")
_NAME = re.compile(r"[A-Z]{2,}s?|[A-Za-z]+[A-Z][A-Za-z]*")   # GPU, NCCL, ZeRO, PyTorch


def _word(token: str) -> str | None:
    """The English word a token is, or None when it is code, a number or a name."""
    core = token.strip(_EDGES)
    if not _WORD.fullmatch(core):
        return None                       # code: digits, _, ., /, =, brackets inside
    return core


def _is_prose(word: str) -> bool:
    if len(word) == 1 or _NAME.fullmatch(word):
        return False
    return word.lower() not in ALLOWED and word.lower().rstrip("s") not in ALLOWED


def _repository_lines() -> frozenset:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return frozenset(line.strip() for pattern in REPOSITORY_FILES
                     for path in root.glob(pattern) if path.is_file()
                     for line in path.read_text(errors="replace").splitlines()
                     if line.strip())


_KEPT_LINES = _repository_lines()


def _corpus_lines() -> list:
    """Lab 10's corpus, Python's own reference (pydoc_data.topics, English in both
    editions): the lab prints its first lines and a sample of the GPT trained on it,
    which begins with one of them. Sorted, to find a line cut short by bisection."""
    from pydoc_data.topics import topics

    return sorted({line.strip() for text in topics.values()
                   for line in text.splitlines() if line.strip()})


_CORPUS_LINES = _corpus_lines()


def _is_corpus_line(line: str) -> bool:
    """Is ``line`` a line of the corpus, or the start of one that a print cut short
    (40 characters at least: a short line of prose could begin some line of it)?"""
    line = line.strip()
    at = bisect.bisect_left(_CORPUS_LINES, line)
    found = _CORPUS_LINES[at] if at < len(_CORPUS_LINES) else ""
    return bool(line) and (found == line or len(line) >= 40 and found.startswith(line))


def _without_kept(text: str) -> str:
    text = "\n".join(" 0 " if line.strip() in _KEPT_LINES or _is_corpus_line(line)
                     else line for line in text.split("\n"))
    text = _CODE_TUPLE.sub(" 0 ", _URL.sub(" 0 ", _SPAN.sub(" 0 ", text)))
    for pattern in KEPT_VERBATIM:
        text = re.sub(pattern, " 0 ", text)
    return text


def english_runs(text: str) -> list[str]:
    """Return the runs of English prose in ``text``: two or more English words in a
    row (only spaces and punctuation between them; Chinese, code, a number or a line
    break ends a run), not counting the words of ``ALLOWED``."""
    found = []
    for segment in _BREAK.split(_without_kept(text)):
        run = []
        for token in segment.split() + ["0"]:
            word = _word(token)
            if word is not None:
                run.append(word)
                continue
            if sum(_is_prose(w) for w in run) >= 2:
                found.append(" ".join(run))
            run = []
    return found


def label_is_english(text: str) -> bool:
    """Is a short label (a figure's text, a widget's) English? Two English words in a
    row, or, when it has no Chinese at all, a single one ("measured", "step")."""
    if english_runs(text):
        return True
    if _CJK.search(text):
        return False
    return any(_is_prose(w) for w in map(_word, _without_kept(text).split())
               if w is not None)


# ------------------------------------------------------------------ cell outputs

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TAG = re.compile(r"<[^>]+>")
# A traceback's frame header and the source lines it quotes: code, not prose.
_CODE_LINE = re.compile(r"^\s*(-*>\s*)?\d+\s|^\s*File\s|^\s*Cell\s+In\[|^\s*\.\.\.|"
                        r"^\s*\^+\s*$|^-+$|^\s*Traceback \(most recent call last\)")
_WIDGET = "application/vnd.jupyter.widget-view+json"


def _plain_html(html: str) -> str:
    import html as html_module

    return html_module.unescape(_TAG.sub(" ", html))


def shown_texts(outputs) -> list[tuple[str, str]]:
    """Return (kind, text) for what JupyterLab shows of a cell's outputs: streams,
    errors, and each display's richest text (a widget's or a figure's words come from
    the kernel's probe instead of their ``text/plain`` stand-in)."""
    shown = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            shown.append((f"stream {out.get('name')}",
                          _ANSI.sub("", out.get("text", ""))))
        elif kind == "error":
            lines = _ANSI.sub("", "\n".join(out.get("traceback", []))).splitlines()
            own = [line for line in lines if not _CODE_LINE.search(line)]
            shown.append(("error", f"{out.get('ename')}: {out.get('evalue')}"))
            shown.append(("error traceback", "\n".join(own)))
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if _WIDGET in data or "image/png" in data or "image/svg+xml" in data:
                continue                          # the probe reads these
            for mime in ("text/html", "text/markdown", "text/plain"):
                if mime in data:
                    text = data[mime]
                    text = "".join(text) if isinstance(text, list) else text
                    shown.append((mime, _plain_html(text) if mime == "text/html"
                                  else text))
                    break
    return shown
