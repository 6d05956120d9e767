"""The English-in-output check of the Chinese notebooks: its rule on examples
(tests/english_prose.py), and the nbval hook (tests/chinese_outputs.py) on a small
Chinese notebook run for real."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import english_prose as ep

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, runs", [
    ("Training on cpu: torch.cuda.is_available() is False", ["Training on cpu"]),
    ("真实的限速链路：needs root (uid 1000 here)；已跳过", ["needs root"]),
    ("activations' share of the counted bytes： 你的猜测 0.5",
     ["share of the counted bytes"]),
    ("ResNet-50 gradients, 8 GPUs over 10 GbE: 143.36 ms per step", ["ms per step"]),
])
def test_english_sentences_are_found(text, runs):
    """Two English words in a row, however much code or Chinese stands around them."""
    assert [r for r in ep.english_runs(text) if any(x in r for x in runs)], \
        ep.english_runs(text)


@pytest.mark.parametrize("text", [
    "在 cpu 上训练：torch.cuda.is_available() 为 False",
    "后端：gloo，2 个 rank，在 CPU 上（没有 GPU）",
    "rank 0 vs rank 1：最大 |差值| = 0.0e+00",
    "DDP 2 个 rank：1,234 images/s，all-reduce 12.3 ms/step，4.2 GiB",
    "3 个 worker，NCCL 和 gloo 都可用：True",
    "fc2.weight (dim, hidden)：列 = 输入特征",                # a shape is code
    "`checks.use_reference(\"dp_step.py\")` 会换上参考实现",     # a code span
    "RuntimeError: Expected input batch_size (13) to match target batch_size (12).",
    'File "/tmp/x.py", line 3, in divide',
    "W1201 22:13:24.956000 14494 torch/distributed/run.py:982] Setting OMP_NUM_THREADS",
    "rank 1：运行中，位于 distributed_c10d.py:3787 in broadcast <- x.py:15 in mismatch",
    "/bin/bash: line 1: nvidia-smi: command not found",
    "/usr/bin/sh: 1: nvidia-smi: not found",
])
def test_code_names_terms_and_third_party_text_pass(text):
    """Identifiers, TERMINOLOGY.md's English terms, units, and what torch or bash
    says verbatim are not the course's English."""
    assert ep.english_runs(text) == []


def test_lab_10s_corpus_is_kept_as_python_writes_it():
    """Lab 10 prints its corpus (Python's reference), cut short after 240 characters,
    and a sample that starts with one of its lines: kept. A short line of prose that
    merely begins a corpus line, or a sentence of the course's, is not."""
    from pydoc_data.topics import topics

    start = "\n\n".join(topics[name] for name in sorted(topics))[:240]
    assert ep.english_runs(start) == []
    assert ep.english_runs('The "while" statement\n') == []
    assert ep.english_runs("pydoc_data.topics（PSF License Agreement）") == []
    assert ep.english_runs("The object") and ep.english_runs("The ranks did not agree")


def test_a_label_is_english_with_one_word_when_it_has_no_chinese():
    """A figure's or a widget's label: "measured" alone is English, "实测" or a name
    is not."""
    assert ep.label_is_english("measured") and ep.label_is_english("ms per step")
    assert not ep.label_is_english("实测（measured）")
    assert not any(map(ep.label_is_english, ["DDP", "ZeRO-3", "H200", "rank 0", "0.5",
                                             "Llama 2 7B", "all-reduce"]))


def test_what_jupyterlab_shows_is_what_is_read():
    """The richest text of a display, a stream, an error's own lines (not the code
    its traceback quotes); a widget's and a figure's stand-ins are left to the probe."""
    outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="one\n"),
        nbformat.v4.new_output("display_data", data={"text/plain": "<Figure>",
                                                     "image/png": "..."}),
        nbformat.v4.new_output("display_data", data={
            "text/plain": "VBox(...)",
            "application/vnd.jupyter.widget-view+json": {"model_id": "x"}}),
        nbformat.v4.new_output("execute_result", data={"text/plain": "plain",
                                                       "text/html": "<b>bold</b> text"},
                               execution_count=1),
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad input",
                               traceback=["\x1b[31mValueError\x1b[0m  Traceback",
                                          "Cell In[3], line 2", "----> 2 raise x",
                                          "ValueError: bad input"]),
    ]
    shown = ep.shown_texts(outputs)
    assert ("stream stdout", "one\n") in shown
    assert ("error", "ValueError: bad input") in shown
    assert ("text/html", " bold  text") in shown
    assert not [t for k, t in shown if "Figure" in t or "VBox" in t or "raise x" in t]


def test_the_hook_is_registered_for_the_nbval_run(request):
    """tests/conftest.py registers it, so that solutions/zh_CN's cells meet it."""
    assert request.config.pluginmanager.get_plugin("labkit-english-in-outputs")


CELLS = [
    'print("后端：gloo，2 个 rank")',
    'print("Training on cpu: no usable GPU")',
    ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
     "ax.set_title('实测')\nax.set_xlabel('ms after backward began')"),
    ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
     "ax.plot([1], label='测量')\nax.legend()\nfig.savefig('x.png')\nplt.close(fig)"),
    "import ipywidgets\nipywidgets.IntSlider(description='batch size')",
]


def test_a_chinese_notebook_fails_where_it_shows_english(tmp_path):
    """Run for real under nbval with the hook: does each English cell fail, naming the
    notebook, the cell and the string, and each Chinese one pass?"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source, id=f"c{i}")
                for i, source in enumerate(CELLS)]
    nb.metadata["labkit"] = {"lang": "zh_CN"}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "zh.ipynb")
    (tmp_path / "conftest.py").write_text(
        "from chinese_outputs import EnglishInOutputs\n\n\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(EnglishInOutputs(), 'english')\n")
    env = {**os.environ, "MPLBACKEND": "agg", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "tests"), str(ROOT), str(ROOT / "tooling"),
         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--nbval-lax", "--nbval-current-env", "-q", "zh.ipynb",
                           "-c", os.devnull, "--rootdir", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=540)
    out = done.stdout + done.stderr
    assert "3 failed, 2 passed" in out, out[-3000:]
    assert "zh.ipynb Cell 1 (cell id c1)" in out and "'Training on cpu no usable" in out
    assert "zh.ipynb Cell 2 (cell id c2)" in out and "'ms after backward began'" in out
    assert "zh.ipynb Cell 4 (cell id c4)" in out and "'batch size'" in out
    assert "English in the Chinese outputs: 5 cells looked at" in out
