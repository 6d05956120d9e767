"""The primers a track may carry in place of a lab (book/primers/): their programs run
as the page says, and both editions show the same program."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coursetools import tracks

ROOT = Path(__file__).resolve().parents[2]
_PROGRAM = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _program(page: Path) -> str:
    found = _PROGRAM.findall(page.read_text(encoding="utf-8"))
    assert len(found) == 1, f"{page}: one program expected"
    return found[0]


@pytest.mark.parametrize("name", sorted(tracks.PRIMERS))
def test_the_primers_program_runs_on_two_ranks_as_the_page_says(name, tmp_path):
    """Does the page's program, started with the torchrun line it gives, print on
    each rank that its half's gradients equal the unsplit model's?"""
    page = ROOT / tracks.PRIMERS[name].page
    script = tmp_path / f"{name}_primer.py"
    script.write_text(_program(page))
    assert f"torchrun --standalone --nproc-per-node 2 {script.name}" in page.read_text()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", script.name], cwd=tmp_path, capture_output=True,
        text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: gradients equal the unsplit model's: True" in done.stdout


@pytest.mark.parametrize("name", sorted(tracks.PRIMERS))
def test_the_chinese_primer_shows_the_same_program(name):
    """Is the Chinese page's program the English one, line for line?"""
    page = ROOT / tracks.PRIMERS[name].page
    chinese = ROOT / "book" / "zh_CN" / page.relative_to(ROOT / "book")
    assert _program(chinese) == _program(page)
