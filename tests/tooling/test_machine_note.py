"""The book's machine note says the backend the labs' 2-rank jobs really ran on:
NCCL with a GPU per rank, gloo CPU ranks on one GPU (where "NCCL between GPU ranks"
was wrong), and gloo without a GPU. Run with faked GPU counts, in both editions."""

import pytest
import torch

from coursetools import book, measure


def _note(monkeypatch, gpus: int, lang: str) -> str:
    """Run the machine cell's code as the book's kernel would; return its note."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(measure, "machine", lambda: {"on": f"{gpus} GPU(s)", "cpu": "x",
                                                   "torch": "2.14.1"})
    english = book.nbformat.v4.new_notebook()
    namespace = {}
    exec(book.machine_cell(english, lang=lang).source, namespace)
    return namespace["_note"]


@pytest.mark.parametrize("gpus, backend", [(2, "nccl on cuda"), (1, "gloo on cpu")])
def test_machine_note_names_the_backend_the_2_rank_jobs_ran(monkeypatch, gpus,
                                                            backend):
    """2 GPUs: NCCL; 1 GPU (one H200): the 2-rank labs run gloo on CPU ranks."""
    note = _note(monkeypatch, gpus, "en")
    assert f"{gpus} GPU(s); the labs' 2-rank jobs ran {backend} ranks (" in note
    assert "NCCL between GPU ranks" not in note


def test_machine_note_in_chinese_names_it_too(monkeypatch):
    """The Chinese edition says gloo on one GPU as well."""
    note = _note(monkeypatch, 1, "zh_CN")
    assert ("1 块 GPU；各实验的双 rank 作业运行在 cpu rank 上，"
            "后端为 gloo（") in note


def test_machine_note_without_gpus_says_cpu_ranks(monkeypatch):
    note = _note(monkeypatch, 0, "en")
    assert "no GPU, so every rank is a CPU process on the gloo backend" in note
