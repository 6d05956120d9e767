"""labkit.torchrun_preloaded: what a script sees under it is what it sees under torchrun.

Lab 03's torchrun check runs the learner's script under it (workers forked after
torch is imported) instead of ``python -m torch.distributed.run``; a script must not
be able to tell them apart, nor a failure read differently.
"""

import json
import os
import subprocess
import sys

from labkit.multinode import NO_SHARED_STORE

SHOWS_ITS_WORLD = """
import json, os, sys
import torch.distributed as dist

dist.init_process_group("gloo")
seen = {name: os.environ.get(name) for name in (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")}
seen.update(name=__name__, argv=sys.argv[1:], path0=sys.path[0],
            world=dist.get_world_size())
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as out:
    json.dump(seen, out)
dist.destroy_process_group()
"""

RAISES = """
import os
if os.environ["RANK"] == "1":
    raise ValueError("rank one's own mistake")
"""

RAISES_WHILE_THE_OTHER_BLOCKS = RAISES + """
from datetime import timedelta
import torch.distributed as dist
# Rank 0 blocks inside C++ (a store read of a key nobody writes), where no Python
# signal handler runs: as a rank does in gloo's connect or a collective's set-up.
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=timedelta(seconds=300))
store.get("never-written")
"""


def _run(runner: str, script, *args, extra=()) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", runner, "--standalone", "--local-addr=127.0.0.1",
               "--nproc-per-node=2", *extra, str(script), *map(str, args)]
    # torch 2.14's agent shares its rendezvous store with the ranks across restarts, so
    # a restarted rank can read a dead rank's gloo address (pytorch #135712); lab 09
    # teaches it, and every run of the course turns the sharing off, as here.
    env = {**os.environ, "OMP_NUM_THREADS": "1", **NO_SHARED_STORE,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(command, capture_output=True, text=True, timeout=180,
                          env=env, cwd=script.parent)


def _failure(done: subprocess.CompletedProcess) -> str:
    """The start and the end of stderr: the first error, then torchrun's summary."""
    lines = done.stderr.splitlines()
    return "\n".join([*lines[:40], "...", *lines[-40:]])


def _seen(folder) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_script_sees_what_torchrun_shows_it(tmp_path):
    """Same environment variables, ``__name__``, ``sys.argv``, script folder on
    ``sys.path`` and world, under torchrun and under labkit.torchrun_preloaded?"""
    script = tmp_path / "shows.py"
    script.write_text(SHOWS_ITS_WORLD)
    seen = {}
    for runner in ("torch.distributed.run", "labkit.torchrun_preloaded"):
        folder = tmp_path / runner
        folder.mkdir()
        done = _run(runner, script, folder, "extra-arg", extra=["--max-restarts=2"])
        assert done.returncode == 0, _failure(done)
        seen[runner] = _seen(folder)
        for record in seen[runner]:
            record["argv"][0] = "FOLDER"   # each run wrote to its own
    real, preloaded = seen.values()
    assert preloaded == real
    assert [r["RANK"] for r in real] == ["0", "1"] and real[0]["name"] == "__main__"
    assert real[0]["path0"] == str(tmp_path) and real[0]["world"] == 2


def test_a_failing_rank_fails_the_run_with_its_error_on_stderr(tmp_path):
    """A rank that raises: exit code 1, and its traceback on stderr, as with torchrun?"""
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    for runner in ("torch.distributed.run", "labkit.torchrun_preloaded"):
        done = _run(runner, script)
        assert done.returncode == 1, runner
        assert "ValueError: rank one's own mistake" in done.stderr, runner


def test_a_rank_blocked_in_cpp_stops_at_once_when_another_fails(tmp_path):
    """When rank 1 fails, the agent SIGTERMs rank 0; a forked worker that kept the
    agent's SIGTERM handler could not run it inside C++ and was SIGKILLed 30 s later.
    Does it die of the SIGTERM, as a fresh ``python script.py`` does?"""
    script = tmp_path / "raises_while_the_other_blocks.py"
    script.write_text(RAISES_WHILE_THE_OTHER_BLOCKS)
    done = _run("labkit.torchrun_preloaded", script)
    assert done.returncode == 1, _failure(done)
    assert "ValueError: rank one's own mistake" in done.stderr
    assert "Unable to shutdown process" not in done.stderr, _failure(done)


def test_only_standalone_script_runs_are_taken(tmp_path):
    """Without --standalone (or with -m), a one-line error, not an agent's traceback."""
    script = tmp_path / "shows.py"
    script.write_text("")
    done = subprocess.run([sys.executable, "-m", "labkit.torchrun_preloaded",
                           "--nproc-per-node=2", str(script)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 2
    assert "runs a script with --standalone only" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_killed_rank_is_restarted_with_the_restart_count(tmp_path):
    """--max-restarts: rank 1 SIGKILLs itself in the first attempt; does the agent
    restart the group, with TORCHELASTIC_RESTART_COUNT=1 the second time?"""
    script = tmp_path / "dies_once.py"
    script.write_text(
        "import os, signal, sys\n"
        "count = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "open(os.path.join(sys.argv[1], f\"{os.environ['RANK']}.{count}\"), 'w')\n"
        "if count == '0' and os.environ['RANK'] == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = _run("labkit.torchrun_preloaded", script, tmp_path, extra=["--max-restarts=1"])
    assert done.returncode == 0, done.stderr[-2000:]
    # (rank 0 of the first attempt may be stopped before its first line, under load)
    assert {"1.0", "0.1", "1.1"} <= {p.name for p in tmp_path.iterdir()}
