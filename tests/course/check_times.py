"""How long does each check take a learner? Time every check of every lab, per attempt.

Run from the course root (a script, not a test: no verdict rests on speed)::

    PYTHONPATH=$PWD:$PWD/tooling python tests/course/check_times.py \
        --labs 03 09 --attempts 5 --busy 2 --out times.json

Each lab runs in a fresh Python, as a fresh kernel would: its first code cell (the
imports and ``labkit.begin``), then for every exercise the solved cell (a
``%%writefile`` cell writes its file, a function cell is executed) and its check
cell (with ``--stubs``, first on the learner's stub), ``--attempts`` times, each attempt timed on its own (wall seconds, and the
CPU seconds of every process the check ran, which do not depend on the load).
``--busy N`` starts N
busy loops (``while 1: pass``) at the same niceness as the checks for the whole
run, the way other learners' work loads a shared server, and stops them at the
end. The load average is recorded next to every lab, since this machine is shared.
"""

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree_cpu() -> float:
    """CPU seconds used so far by this process and every process below it.

    Live processes count their own time and that of the children they waited for
    (a forkserver reaps its ranks); the checks' processes are all below this one.
    The figure does not depend on the machine's load, as wall time does.
    """
    tick, mine, parents = os.sysconf("SC_CLK_TCK"), os.getpid(), {}
    times = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:   # ended meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15]) / tick   # u, s, cu, cs
    below, grew = {mine}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in below} - below
        below |= found
        grew = bool(found)
    return sum(times.get(pid, 0.0) for pid in below)


def _lab_times(notebook: str, attempts: int, only: list[str],
               with_stubs: bool = False) -> list[dict]:
    """In this process: the lab's first cell, then each exercise's check, timed."""
    import nbformat

    from coursetools import notebooks

    solution = nbformat.read(ROOT / "solutions" / notebook, as_version=4)
    os.chdir(tempfile.mkdtemp(prefix="lab-"))   # in the parent's scratch ($TMPDIR)
    namespace = {"__name__": "__main__"}
    first = next(c for c in solution.cells if c.cell_type == "code")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(first.source, namespace)
    stubs = notebooks.make_lab(solution).cells if with_stubs else None
    rows = []
    for ex in notebooks.exercises(solution, notebook):
        check = solution.cells[ex["check_cell"]].source
        timed = not only or ex["check"] in only
        if timed and stubs is not None:   # the learner's first try: the stub
            _write_exercise(ex, _stub_source(stubs[ex["cell"]].source), namespace)
            rows.append(_timed_row(notebook, ex, "stub", check, attempts, namespace))
        _write_exercise(ex, ex["source"], namespace)
        if timed:
            rows.append(_timed_row(notebook, ex, "solution", check, attempts,
                                   namespace))
    return rows


def _stub_source(cell: str) -> str:
    """The code of a learner's stub cell, without its %%writefile line."""
    return cell.partition("\n")[2] if cell.startswith("%%writefile") else cell


def _write_exercise(ex: dict, source: str, namespace: dict) -> None:
    """Do what running the exercise cell does: write its file, or define its code."""
    if ex["kind"] == "file":
        Path(ex["file"]).write_text(source)
        sys.modules.pop(Path(ex["file"]).stem, None)   # the check loads it afresh
    else:
        exec(source, namespace)


def _timed_row(notebook: str, ex: dict, variant: str, check: str, attempts: int,
               namespace: dict) -> dict:
    """Run a check cell ``attempts`` times: wall and CPU seconds, and its errors."""
    seconds, cpu, errors = [], [], []
    for _attempt in range(attempts):
        start, used = time.perf_counter(), _tree_cpu()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(check, namespace)
        except Exception as err:   # a failing check: report it, time it anyway
            errors.append(f"{type(err).__name__}: {str(err)[:300]}")
        seconds.append(time.perf_counter() - start)
        cpu.append(_tree_cpu() - used)
    return {"lab": notebook[:2], "check": ex["check"], "variant": variant,
            "seconds": seconds, "cpu": cpu, "errors": errors}


def _busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            for _ in range(count)]


def _summary(row: dict) -> str:
    s = row["seconds"]
    first = f"{s[0]:5.1f}"
    rest = s[1:] or s
    cpu = statistics.median(row["cpu"])
    return (f"{row['lab']} {row['check']:22s} {row.get('variant', ''):8s} first {first} s, then median "
            f"{statistics.median(rest):5.1f} s (range {min(rest):.1f}-{max(rest):.1f})"
            f"; all: median {statistics.median(s):.1f}, max {max(s):.1f}; "
            f"CPU median {cpu:.1f} s"
            + (f"  FAILED {len(row['errors'])}: {row['errors'][0][:120]}"
               if row["errors"] else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="*", default=[], help="e.g. 03 09 (all)")
    parser.add_argument("--checks", nargs="*", default=[], help="only these checks")
    parser.add_argument("--attempts", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside")
    parser.add_argument("--stubs", action="store_true",
                        help="time each check on the learner's stub first, too")
    parser.add_argument("--out", default="", help="append JSON lines here")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:   # the child: one lab, rows as JSON on the last line
        print(json.dumps(_lab_times(args.one, args.attempts, args.checks,
                                    args.stubs)))
        return
    names = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb")
                   if not args.labs or p.name[:2] in args.labs)
    busy = _busy_loops(args.busy)
    try:
        for name in names:
            load = os.getloadavg()
            # the child's temp files (its working folder, the lab's workdir, which
            # the lab's last cell would remove, labkit's scratch) go when it ends
            with tempfile.TemporaryDirectory(prefix="check-times-") as scratch:
                done = subprocess.run(
                    [sys.executable, __file__, "--one", name, "--attempts",
                     str(args.attempts), *(["--stubs"] if args.stubs else []),
                     "--checks", *args.checks],
                    capture_output=True, text=True, cwd=ROOT,
                    env={**os.environ, "TMPDIR": scratch})
            if done.returncode:
                print(f"{name}: the timing run failed\n{done.stderr[-2000:]}")
                continue
            for row in json.loads(done.stdout.strip().splitlines()[-1]):
                row.update(busy=args.busy, load=[round(x, 1) for x in load],
                           load_after=[round(x, 1) for x in os.getloadavg()])
                print(_summary(row), f"[load {row['load'][0]}]", flush=True)
                if args.out:
                    with open(args.out, "a") as out:
                        out.write(json.dumps(row) + "\n")
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


if __name__ == "__main__":
    main()
