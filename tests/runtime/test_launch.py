"""The launcher's guardrails, each fault injected on purpose (CPU, gloo, 2 ranks).

The workers below live at module level so that ranks can import them (``test_launch``
is importable because pytest puts tests/ on sys.path, and ranks get the parent's).
"""

import functools
import multiprocessing
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import psutil
import pytest
import torch
import torch.distributed as dist

from labkit import crowding, launch

# ---------------------------------------------------------------- workers


def rank_and_sum(ctx, offset):
    total = torch.tensor([float(ctx.rank)], device=ctx.device)
    dist.all_reduce(total)
    return {"rank": ctx.rank, "world_size": ctx.world_size,
            "sum": total.item() + offset, "threads": torch.get_num_threads(),
            "device": str(ctx.device),
            "backend": ctx.backend, "initialized": dist.is_initialized()}


def raise_on_rank_one(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one is unhappy")
    dist.all_reduce(torch.ones(1))   # rank 0 blocks here until it is stopped
    return ctx.rank


def skip_collective_on_rank_one(ctx):
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(1))
    return ctx.rank


def sleep_on_rank_one(ctx, seconds):
    if ctx.rank == 1:
        time.sleep(seconds)
    return ctx.rank


def die_on_rank_one(ctx, how):
    if ctx.rank == 1:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # abort leaves no core file
        {"exit": lambda: os._exit(3), "abort": os.abort,
         "kill": lambda: os.kill(os.getpid(), signal.SIGKILL)}[how]()
    dist.all_reduce(torch.ones(1))   # rank 0 sees "Connection closed by peer"
    return ctx.rank


def return_tensor(ctx):
    return torch.arange(4.0) + ctx.rank


def return_tensors_of_every_kind(ctx):
    return {"plain": torch.arange(6.0).reshape(2, 3), "scalar": torch.tensor(7),
            "empty": torch.zeros(0, 3), "transposed": torch.arange(6.0).reshape(2, 3).t(),
            "strided": torch.arange(10)[::2], "bf16": torch.arange(3.0).bfloat16(),
            "bool": torch.tensor([True, False]), "conj": torch.tensor([1 + 2j]).conj(),
            "parameter": torch.nn.Parameter(torch.ones(2)),
            "grad": torch.ones(2, requires_grad=True),
            "sparse": torch.eye(2).to_sparse(), "nested": [{"x": torch.ones(1)}]}


def interval_and_world(ctx, seconds):
    start = time.monotonic()   # one clock for every process of the machine
    time.sleep(seconds)
    dist.barrier()
    return {"start": start, "end": time.monotonic(), "world": dist.get_world_size()}


def harness_preloaded(ctx):
    return "labkit.labs.capstone.harness" in sys.modules


def return_unpicklable(ctx):
    return threading.Lock()


def raise_main_lookup(ctx):
    raise AttributeError("Can't get attribute 'Net' on <module '__mp_main__'>")


def raise_bad_fork(ctx):
    raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA "
                       "with multiprocessing, you must use the 'spawn' start method")


def read_environment(ctx, name):
    return os.environ.get(name)


def cuda_state(ctx):
    return {"initialized": torch.cuda.is_initialized(), "threads": torch.get_num_threads()}


def write_pid_then_sleep(ctx, folder):
    with open(os.path.join(folder, f"rank{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def helper_not_a_worker(ctx):
    return "the one the module defines"


def _note_pid(folder, worker_id):
    with open(os.path.join(folder, f"loader{os.getpid()}.pid"), "w") as f:
        f.write(str(os.getpid()))


def with_dataloader_workers(ctx, folder, then):
    """Start DataLoader(num_workers=2) on every rank, then: return, raise or sleep."""
    dataset = torch.utils.data.TensorDataset(torch.arange(64.0))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=8, num_workers=2, persistent_workers=True,
        worker_init_fn=functools.partial(_note_pid, folder))
    total = sum(batch[0].sum().item() for batch in loader)   # workers now exist
    if then == "raise":
        dist.barrier()   # every rank's workers exist before rank 1 fails
    if then == "raise" and ctx.rank == 1:
        raise ValueError("rank one fails while its workers are alive")
    if then == "sleep":
        with open(os.path.join(folder, f"rank{ctx.rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    dist.barrier()
    return total


def spin_forever(ctx):
    while True:   # never enters a collective: only the deadline can end it
        pass


def raise_own_timeout(ctx, error):
    raise error


def uneven_ddp_steps(ctx):
    """Rank 0 runs one more DDP step: its all-reduce inside backward times out."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    for _ in range(3 if ctx.rank == 0 else 2):
        model(torch.ones(2, 4)).sum().backward()
    return ctx.rank


# ---------------------------------------------------------------- helpers


def _descendants() -> set[int]:
    """Return the pids of every process below this one (the forkserver included)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait_for_new_descendants(before: set[int], count: int, limit: float = 30.0):
    """Block until ``count`` processes that were not in ``before`` exist."""
    deadline = time.monotonic() + limit
    while len(_descendants() - before) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def run_gloo(worker, world_size=2, **kwargs):
    """Launch on CPU ranks with gloo, whatever GPUs the machine has."""
    return launch.run(worker, world_size, **{"backend": "gloo", **kwargs})


@pytest.fixture
def server():
    """A running forkserver, so counting children sees only the ranks come and go."""
    launch.warm_up()
    run_gloo(rank_and_sum, world_size=1, args=(0,))   # waits until it is ready


# ---------------------------------------------------------------- the happy path


def test_results_come_back_per_rank_in_rank_order(capsys):
    """Does each rank's return value come back, in rank order, with the group up?"""
    results = run_gloo(rank_and_sum, world_size=2, args=(10,), timeout=30)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 11.0 and r["world_size"] == 2 for r in results)
    assert all(r["threads"] == 1 and r["device"] == "cpu" for r in results)
    assert all(r["backend"] == "gloo" and r["initialized"] for r in results)
    printed = capsys.readouterr().out
    assert "Backend: gloo" in printed and "Launching 2 rank(s)" in printed


def test_tensor_results_outlive_the_ranks():
    """Do returned tensors arrive by value, usable after the ranks have exited?"""
    results = run_gloo(return_tensor, world_size=2)
    assert torch.equal(results[1], torch.arange(4.0) + 1)
    assert not results[1].is_shared()   # not a handle into a dead rank's memory


def test_tensors_of_every_kind_come_back_equal():
    """Does every kind of tensor come back equal and of its type: the fast path
    (plain CPU tensors as raw bytes) and what goes the plain way?"""
    want = return_tensors_of_every_kind(None)
    got = run_gloo(return_tensors_of_every_kind, world_size=1)[0]
    for name, tensor in want.items():
        if name == "nested":
            assert torch.equal(got[name][0]["x"], tensor[0]["x"])
            continue
        assert type(got[name]) is type(tensor) and got[name].dtype == tensor.dtype, name
        assert got[name].requires_grad == tensor.requires_grad, name
        dense = (lambda t: t.detach().to_dense() if t.is_sparse else t.detach())
        assert torch.equal(dense(got[name]), dense(tensor)), name


def test_concurrent_jobs_run_at_once_each_in_its_own_group(capsys):
    """Do run_concurrently's jobs overlap in time, each with its own process group
    and its results in order?"""
    jobs = [(interval_and_world, 2, (1.0,)), (interval_and_world, 1, (1.0,)),
            (rank_and_sum, 2, (5,))]
    first, second, third = launch.run_concurrently(jobs, backend="gloo", timeout=30)
    assert [r["world"] for r in first] == [2, 2] and second[0]["world"] == 1
    assert [r["sum"] for r in third] == [6.0, 6.0]
    assert second[0]["start"] < min(r["end"] for r in first)   # overlapped
    assert min(r["start"] for r in first) < second[0]["end"]
    assert capsys.readouterr().out.count("Launching") == 3


def test_a_failing_concurrent_job_is_named_and_stops_every_job():
    """Does a rank's error in one job stop the others' ranks at once, naming the job?"""
    before = _descendants()
    start = time.monotonic()
    with pytest.raises(launch.WorkerError, match="rank one is unhappy") as caught:
        launch.run_concurrently([(sleep_on_rank_one, 2, (300,)),
                                 (raise_on_rank_one, 2, ())], backend="gloo",
                                timeout=30)
    assert caught.value.job == 1 and caught.value.rank == 1
    assert time.monotonic() - start < 60   # not the 300 s sleep of job 0
    time.sleep(0.5)
    assert _descendants() - before <= _forkserver_pids()


def _forkserver_pids() -> set[int]:
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid
    return {pid} if pid else set()


def test_the_helper_preloads_the_modules_a_labs_ranks_import():
    """After a lab's room is imported (lab 10's names its harness in RANK_MODULES),
    does a newly started helper hand its ranks that module already imported?"""
    from labkit import _forkserver
    import labkit.labs.capstone  # noqa: F401  the room, as lab 10's setup cell imports it

    _forkserver.stop()   # the next launch starts a helper with the room's preload
    assert "labkit.labs.capstone.harness" in _forkserver.preload()
    assert run_gloo(harness_preloaded, world_size=1) == [True]


def test_threads_per_rank_is_applied():
    """Does each CPU rank get exactly threads_per_rank threads?"""
    results = run_gloo(rank_and_sum, world_size=1, args=(0,), threads_per_rank=2)
    assert results[0]["threads"] == 2


def test_ranks_see_the_parents_environment_now(monkeypatch, server):
    """Do ranks see a variable set after the forkserver started?"""
    monkeypatch.setenv("LABKIT_TEST_VALUE", "set late")
    results = run_gloo(read_environment, 2, args=("LABKIT_TEST_VALUE",))
    assert results == ["set late"] * 2


def test_two_launches_at_once_both_succeed(capsys):
    """Do two launches started at the same moment each get their own port and finish?"""
    outcomes = {}

    def launch_one(offset):
        outcomes[offset] = run_gloo(rank_and_sum, 2, args=(offset,), timeout=30)

    threads = [threading.Thread(target=launch_one, args=(k,)) for k in (100, 200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r["sum"] for r in outcomes[100]] == [101.0, 101.0]
    assert [r["sum"] for r in outcomes[200]] == [201.0, 201.0]
    ports = re.findall(r"rendezvous on 127\.0\.0\.1:(\d+)", capsys.readouterr().out)
    assert len(ports) == 2 and ports[0] != ports[1]   # threads' prints may interleave


# ---------------------------------------------------------------- faults in the ranks


def test_rank_that_raises_is_named_with_its_traceback():
    """Does a worker's exception come back as one error naming rank and traceback?"""
    start = time.monotonic()
    with pytest.raises(launch.WorkerError, match="Rank 1 raised ValueError") as caught:
        run_gloo(raise_on_rank_one, world_size=2, timeout=30)
    assert caught.value.rank == 1
    assert "rank one is unhappy" in caught.value.traceback
    assert "raise_on_rank_one" in str(caught.value)   # the frame that raised
    assert time.monotonic() - start < 20   # rank 0 was stopped, not waited for


def test_skipped_collective_times_out_and_names_the_rank():
    """Does a collective one rank never joins end as CollectiveTimeout, not a hang?"""
    start = time.monotonic()
    with pytest.raises(launch.CollectiveTimeout, match="Rank 0 waited") as caught:
        run_gloo(skip_collective_on_rank_one, world_size=2, timeout=3)
    assert caught.value.ranks == [0]
    assert "finished ranks: [1]" in str(caught.value)
    assert time.monotonic() - start < 20


class _FinishedRank:
    """A stand-in for a rank whose one message already waits in its pipe (no process)."""

    def __init__(self, message):
        self.results, sender = multiprocessing.Pipe(duplex=False)
        sender.send(message)
        self._never, self._keep = multiprocessing.Pipe(duplex=False)
        self.process = types.SimpleNamespace(sentinel=self._never, exitcode=None,
                                             join=lambda timeout=None: None)


def test_a_timeout_is_reported_not_the_connection_its_exit_closed():
    """Rank 1 times out first and exits; rank 0 then sees "Connection closed by peer".
    Both messages wait when the parent looks (a loaded machine): the error must be
    rank 1's CollectiveTimeout, whichever pipe the parent reads first. (A book build
    under load once reported rank 0's consequence as a WorkerError.)"""
    ranks = [_FinishedRank(("peer_gone", "RuntimeError: Connection closed by peer")),
             _FinishedRank(("timeout", "RuntimeError: Timed out waiting 3000ms"))]
    with pytest.raises(launch.CollectiveTimeout, match="Rank 1 waited") as caught:
        launch._collect([ranks], timeout=3, deadline=60, report_every=60)
    assert "Timed out waiting 3000ms" in str(caught.value)


def test_rank_stuck_outside_collectives_is_ended_by_the_watchdog():
    """Does a rank that never finishes end as CollectiveTimeout naming it?"""
    stuck = r"Rank\(s\) \[1\] did not"
    with pytest.raises(launch.CollectiveTimeout, match=stuck) as caught:
        run_gloo(sleep_on_rank_one, world_size=2, args=(600,), timeout=2)
    assert caught.value.ranks == [1]


@pytest.mark.parametrize("how, message", [
    ("exit", "Rank 1 exited with code 3 before"),
    ("abort", "code -6 .aborted by the backend: NCCL's watchdog"),
    ("kill", "code -9 .killed: out of memory"),
])
def test_rank_that_dies_is_reported_with_its_exit_code(how, message):
    """Does a rank that dies without a result give its exit code and a likely cause?"""
    with pytest.raises(launch.LaunchError, match=message):
        run_gloo(die_on_rank_one, world_size=2, args=(how,), timeout=30)


def test_unpicklable_result_is_a_worker_error():
    """Does a result that cannot be sent back surface as that rank's error?"""
    with pytest.raises(launch.WorkerError, match="Rank 0 raised TypeError"):
        run_gloo(return_unpicklable, world_size=1)


@pytest.mark.parametrize("worker, hint", [
    (raise_main_lookup, "defined in the notebook: move it into a module"),
    (raise_bad_fork, "LABKIT_START_METHOD'. = 'spawn' and launch again"),
])
def test_known_cryptic_errors_get_a_hint(worker, hint):
    """Do a notebook object in args and a CUDA bad fork get a hint on what to do?"""
    with pytest.raises(launch.WorkerError, match=hint):
        run_gloo(worker, world_size=1)


def test_spawn_start_method_works_too(monkeypatch):
    """With LABKIT_START_METHOD=spawn (fresh interpreters), do results come back?"""
    monkeypatch.setenv("LABKIT_START_METHOD", "spawn")
    results = run_gloo(rank_and_sum, world_size=2, args=(0,), timeout=60)
    assert [r["sum"] for r in results] == [1.0, 1.0]


# ---------------------------------------------------------------- interrupt


@pytest.fixture
def sigint_raises_keyboardinterrupt():
    """Make SIGINT raise KeyboardInterrupt here, as a Jupyter kernel does while a cell runs.

    Python installs that handler at start-up only if SIGINT was not ignored. A CI
    runner that starts the suite as a background job (no job control) hands it
    SIGINT ignored, so ``os.kill(pid, SIGINT)`` did nothing and the launch ran into
    its 63 s watchdog: that was CI's red. ipykernel sets this same handler around
    every cell (kernelbase.pre_handler_hook), whatever it inherited.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_interrupt_terminates_every_rank(server, sigint_raises_keyboardinterrupt):
    """Does KeyboardInterrupt in the parent stop every rank, leaving no process?"""
    before, launching = _descendants(), threading.Event()

    def interrupt_when_ranks_run():
        _wait_for_new_descendants(before, 2)
        time.sleep(0.5)
        if launching.is_set():   # never interrupt the rest of the test session
            os.kill(os.getpid(), signal.SIGINT)

    launching.set()
    threading.Thread(target=interrupt_when_ranks_run, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_gloo(sleep_on_rank_one, world_size=2, args=(600,), timeout=60)
    finally:
        launching.clear()
    assert _descendants() == before   # only the forkserver (and nothing new) remains


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("worker, args, processes", [
    ("write_pid_then_sleep", "(sys.argv[2],)", 2),                    # 2 ranks
    ("with_dataloader_workers", "(sys.argv[2], 'sleep')", 6),          # + 4 workers
])
def test_ranks_exit_when_the_parent_is_killed(tmp_path, worker, args, processes):
    """When the notebook kernel dies (SIGKILL), do ranks and their children exit?"""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_launch; "
            f"from labkit import launch; launch.run(test_launch.{worker}, 2, "
            f"args={args}, backend='gloo')")
    parent = subprocess.Popen([sys.executable, "-c", code, os.path.dirname(__file__),
                               str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        # A fresh Python imports torch, then the forkserver does: on a loaded 2-core
        # machine that has taken 80 s. The DataLoader workers write their pid first.
        deadline = time.monotonic() + 240
        while (len(list(tmp_path.glob("*.pid"))) < processes
               and time.monotonic() < deadline):
            time.sleep(0.1)
        time.sleep(0.5)   # any process beyond the expected ones shows up too
        pids = _pids(tmp_path, "*.pid")
        assert len(pids) == processes, "the ranks (and workers) never all started"
    finally:
        parent.kill()
        parent.wait()
    assert _gone_within(pids, 15.0)

_NOTEBOOK = [
    "%%writefile my_worker.py\nimport torch.distributed as dist\n"
    "def worker(ctx):\n    return dist.get_rank()",
    "from labkit import launch\nfrom my_worker import worker\n"
    "print('results', launch.run(worker, 2, backend='gloo'))",
    "def local(ctx):\n    return 1\ntry:\n    launch.run(local, 2)\n"
    "except launch.LaunchError as err:\n    print(err)",
]


def test_from_a_real_notebook_kernel(tmp_path):
    """In a kernel: does a %%writefile worker run, and a cell's function get advice?"""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in _NOTEBOOK]
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = ["".join(out.get("text", "") for out in cell.outputs)
               for cell in notebook.cells]
    assert "results [0, 1]" in printed[1]
    assert "%%writefile my_worker.py" in printed[2] and "'local'" in printed[2]


# ---------------------------------------------------------------- pre-flight checks


@pytest.mark.parametrize("backend, message", [
    ("nccl", "NCCL needs one GPU per rank"),
    ("mpi", "Unknown backend 'mpi'"),
])
def test_impossible_backend_fails_before_anything_starts(backend, message, server):
    """Do NCCL without enough GPUs, and unknown backends, fail before any rank runs?"""
    before = _descendants()
    world_size = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match=message):
        launch.run(rank_and_sum, world_size=world_size, args=(0,), backend=backend)
    assert _descendants() == before


@pytest.mark.parametrize("world_size", [0, -1, 1.5])
def test_bad_world_size_is_refused(world_size):
    """Are zero, negative and fractional world sizes refused with a clear message?"""
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        launch.run(rank_and_sum, world_size=world_size, args=(0,))


@pytest.mark.parametrize("name, value", [("timeout", 0), ("timeout", -5),
                                         ("threads_per_rank", 0),
                                         ("threads_per_rank", 1.5)])
def test_bad_timeout_or_threads_are_refused(name, value):
    """Are non-positive timeouts and thread counts refused?"""
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        run_gloo(rank_and_sum, 2, args=(0,), **{name: value})


def test_worker_defined_in_the_notebook_is_refused_with_advice():
    """Does a worker from __main__ (a notebook cell) get the %%writefile advice?"""
    def worker(ctx):
        return ctx.rank
    worker.__module__, worker.__qualname__ = "__main__", "worker"
    with pytest.raises(launch.LaunchError, match="%%writefile my_worker.py"):
        run_gloo(worker, 2)


def _nested_worker():
    def worker(ctx):
        return 0
    return worker


@pytest.mark.parametrize("worker", [lambda ctx: 0, _nested_worker()])
def test_lambda_or_nested_worker_is_refused(worker):
    """Are lambdas and functions nested in functions refused before starting?"""
    with pytest.raises(launch.LaunchError, match="top level of a module"):
        run_gloo(worker, 2)


def test_not_a_function_is_refused():
    """Is a worker that is not a function from a module refused?"""
    with pytest.raises(launch.LaunchError, match="must be a function"):
        run_gloo(42, 2)


def test_unimportable_worker_module_is_refused():
    """Is a worker whose module the ranks cannot import refused before starting?"""
    def worker(ctx):
        return 0
    worker.__module__, worker.__qualname__ = "no_such_module_for_labkit", "worker"
    with pytest.raises(launch.LaunchError, match="could not import worker"):
        run_gloo(worker, 2)


def test_stale_worker_is_refused():
    """Is a function that is not what its module now defines under that name refused?"""
    def worker(ctx):
        return 0
    worker.__module__, worker.__qualname__ = __name__, "helper_not_a_worker"
    with pytest.raises(launch.LaunchError, match="is not the function passed"):
        run_gloo(worker, 2)


def test_unpicklable_args_are_refused_before_starting():
    """Do arguments that cannot reach the ranks fail in the parent?"""
    with pytest.raises(launch.LaunchError, match="args cannot be sent"):
        run_gloo(rank_and_sum, 2, args=(threading.Lock(),))


# ---------------------------------------------------------------- torchrun side


def test_init_from_env_without_torchrun_says_how_to_start(monkeypatch):
    """Does init_from_env outside torchrun name the missing variable and torchrun?"""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(launch.LaunchError, match="RANK is not set.*torchrun"):
        launch.init_from_env()


def test_init_from_env_joins_a_one_rank_group(monkeypatch):
    """Does init_from_env bring up the group from torchrun's variables?"""
    with socket.socket() as probe:   # a port free right now (torchrun picks one too)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = torch.get_num_threads()
    try:
        ctx = launch.init_from_env(backend="gloo", timeout=10, threads_per_rank=1)
        assert (ctx.rank, ctx.world_size, ctx.backend) == (0, 1, "gloo")
        assert dist.is_initialized() and torch.get_num_threads() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(before)


# ---------------------------------------------------------------- one backend, CUDA-safe


_TRACE_CUDA = """
import importlib, sys, torch
calls = []
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    real = getattr(torch._C, name)
    setattr(torch._C, name, lambda *a, _real=real, _name=name: calls.append(_name)
            or _real(*a))
from labkit import _forkserver
import labkit.labs.capstone   # a room that names its ranks' modules (RANK_MODULES)
for module in _forkserver.preload():
    importlib.import_module(module)
print(calls, torch.cuda.is_initialized())
"""


def test_forkserver_preload_never_asks_cuda():
    """Does importing the forkserver's preload (lab 10's rank modules included) leave
    CUDA alone (no driver query)?

    Any count or availability check reaches ``_cuda_getDeviceCount`` here (no NVML on
    this machine to answer instead), so none being called means none was made.
    """
    done = subprocess.run([sys.executable, "-c", _TRACE_CUDA], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[] False"


def test_forkserver_runs_with_the_nvml_check_and_ranks_start_cuda_free(monkeypatch):
    """Does the forkserver run with PYTORCH_NVML_BASED_CUDA_CHECK=1, leaving the
    notebook's environment as it was, and do its ranks start with CUDA untouched?"""
    from multiprocessing import forkserver

    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    launch.warm_up()
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
    state = run_gloo(cuda_state, world_size=1)[0]   # the server is up by now
    assert state == {"initialized": False, "threads": 1}
    server = forkserver._forkserver._forkserver_pid
    with open(f"/proc/{server}/environ", "rb") as f:
        assert b"PYTORCH_NVML_BASED_CUDA_CHECK=1" in f.read().split(b"\0")


def test_one_rank_job_prints_its_backend_and_notes_a_different_lab_backend(capsys):
    """Does a 1-rank launch print its backend, and say so when the lab chose another?"""
    from labkit import hardware

    try:
        hardware.remember_lab(hardware.Setup("nccl", "cuda", 2, "a lab on 2 GPUs"))
        launch.run(rank_and_sum, world_size=1, args=(0,))
        auto = capsys.readouterr().out
        launch.run(rank_and_sum, world_size=1, args=(0,), backend="gloo")
        passed = capsys.readouterr().out
    finally:
        hardware._LAB.clear()
    chosen = hardware.choose(1, verbose=False)
    assert f"Backend: {chosen.backend} on {chosen.device_type}, 1 rank(s)" in auto
    if chosen.backend != "nccl":
        assert "this lab set up nccl on cuda (2 rank(s))" in auto
        assert "pass backend=setup.backend" in auto
    assert "Note:" not in passed   # a backend passed explicitly is never second-guessed


def test_every_choice_is_recorded_when_asked(tmp_path, monkeypatch):
    """With LABKIT_CHOICE_LOG set, does begin and each launch append what it chose?"""
    import json

    import labkit

    log = tmp_path / "choices.jsonl"
    monkeypatch.setenv("LABKIT_CHOICE_LOG", str(log))
    try:
        labkit.begin(world_size=1, backend="gloo")
        run_gloo(rank_and_sum, world_size=2, args=(0,))
    finally:
        launch.hardware._LAB.clear()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["where"], r["backend"], r["world_size"], r["devices"]) for r in lines] == [
        ("begin", "gloo", 1, "cpu x1"), ("launch", "gloo", 2, "cpu x2")]
    assert lines[1]["what"] == "runtime.test_launch.rank_and_sum"


def test_nccl_groups_are_bound_to_their_gpu_and_gpu_ranks_get_their_threads(
        monkeypatch):
    """Does a CUDA rank get threads_per_rank threads and device_id=<its GPU>?

    Faked on CPU (set_device and init_process_group recorded, not run); the signature
    check makes sure this torch takes a torch.device for ``device_id``.
    """
    import inspect

    from labkit import _spawn

    assert "device_id" in inspect.signature(dist.init_process_group).parameters
    seen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.update(set=d))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: seen.update(backend=backend, **kw))
    before = torch.get_num_threads()
    gpu = torch.device("cuda", 1)
    try:
        _spawn.pin_device(gpu, 3)
        assert torch.get_num_threads() == 3 and seen["set"] == gpu
        _spawn.init_group("nccl", gpu, rank=1, world_size=2)
        assert seen["device_id"] == gpu and seen["backend"] == "nccl"
        seen.clear()
        _spawn.init_group("gloo", torch.device("cpu"), rank=0, world_size=2)
        assert "device_id" not in seen
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- GPUs (else skipped)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_ranks_get_their_own_gpu():
    """Does each NCCL rank get cuda:<rank>, even after the parent initialised CUDA?"""
    torch.zeros(1, device="cuda")   # the parent touches CUDA: a fork would now break
    world_size = torch.cuda.device_count()
    results = launch.run(rank_and_sum, world_size=world_size, args=(0,), backend="nccl")
    assert [r["device"] for r in results] == [f"cuda:{i}" for i in range(world_size)]
    assert all(r["backend"] == "nccl" and r["threads"] == 1 for r in results)


_TORCHRUN_SCRIPT = """
import os
import sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
import test_launch
from labkit import launch

ctx = launch.init_from_env(backend="gloo", threads_per_rank=1)
line = f"result {test_launch.rank_and_sum(ctx, 10)}\\n"
os.write(1, line.encode())   # one write: the two ranks' lines never interleave
dist.destroy_process_group()
"""


def test_same_worker_runs_unchanged_under_torchrun(tmp_path):
    """Does a launch.run worker run as is in a torchrun script via init_from_env?"""
    script = tmp_path / "script.py"
    script.write_text(_TORCHRUN_SCRIPT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", str(script), os.path.dirname(__file__)]
    done = subprocess.run(torchrun, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line for line in done.stdout.splitlines() if line.startswith("result")]
    assert len(results) == 2 and all("'sum': 11.0" in line for line in results)
    assert all("'backend': 'gloo'" in line for line in results)


# ---------------------------------------------------------------- reliability (issue 9)


def _pids(folder, pattern) -> list[int]:
    return [int(p.read_text()) for p in folder.glob(pattern) if p.read_text()]


def _gone_within(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(pid) for pid in pids)


def test_ranks_can_start_dataloader_workers(tmp_path):
    """Can a rank build DataLoader(num_workers=2), and are its workers gone after?"""
    results = run_gloo(with_dataloader_workers, 2, args=(str(tmp_path), "return"))
    assert results == [sum(range(64))] * 2
    workers = _pids(tmp_path, "loader*.pid")
    assert len(workers) == 4   # 2 ranks x 2 workers really started
    assert _gone_within(workers)


def test_rank_error_leaves_no_dataloader_worker(tmp_path):
    """When a rank raises while its DataLoader workers live, are they all ended?"""
    with pytest.raises(launch.WorkerError, match="Rank 1 raised ValueError"):
        run_gloo(with_dataloader_workers, 2, args=(str(tmp_path), "raise"), timeout=20)
    workers = _pids(tmp_path, "loader*.pid")
    assert len(workers) == 4 and _gone_within(workers, 5.0)


def test_interrupt_leaves_no_dataloader_worker(tmp_path, sigint_raises_keyboardinterrupt):
    """Does an interrupt end the ranks' DataLoader workers too?"""
    def interrupt_when_ranks_sleep():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_ranks_sleep, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_gloo(with_dataloader_workers, 2, args=(str(tmp_path), "sleep"), timeout=60)
    pids = _pids(tmp_path, "*.pid")
    assert len(pids) == 6 and _gone_within(pids, 5.0)   # 2 ranks, 4 workers


def test_interrupting_a_kernel_stops_the_ranks(tmp_path):
    """In a real Jupyter kernel, does 'interrupt' end the cell and every rank?"""
    jupyter_client = pytest.importorskip("jupyter_client")
    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                "import test_launch\nfrom labkit import launch\n"
                "launch.run(test_launch.write_pid_then_sleep, 2, "
                f"args=({str(tmp_path)!r},), backend='gloo')")
        msg_id = client.execute(code)
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = _pids(tmp_path, "rank*.pid")
        assert len(pids) == 2, "the ranks never started"
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:   # e.g. kernel_info's
            reply = client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert _gone_within(pids, 5.0)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_absurd_world_size_is_refused_before_starting(server):
    """On a small machine, are 64 CPU ranks refused, naming the limit and override?"""
    before = _descendants()
    limit = crowding.RANKS_PER_CORE * launch.hardware.cpu_count()
    with pytest.raises(launch.LaunchError,
                       match=f"over the limit of {limit} threads.*allow_oversubscription"):
        run_gloo(rank_and_sum, world_size=limit + 1, args=(0,))
    assert _descendants() == before


def test_ranks_beyond_memory_are_refused(monkeypatch, server):
    """Is a launch whose ranks would not fit in the memory available refused?"""
    monkeypatch.setattr(launch.hardware, "memory_available_bytes", lambda: 2**29)
    monkeypatch.setenv("LABKIT_MEMORY_WAIT_S", "0")
    with pytest.raises(launch.LaunchError, match="only 0.5 GiB of memory is available"):
        run_gloo(rank_and_sum, world_size=2, args=(0,))


def test_oversubscription_can_be_allowed_explicitly(monkeypatch):
    """With allow_oversubscription=True, does a launch over the limit run?"""
    monkeypatch.setattr(crowding, "RANKS_PER_CORE", 0.25)
    results = run_gloo(rank_and_sum, world_size=1, args=(0,),
                       allow_oversubscription=True)
    assert results[0]["sum"] == 0.0


def test_ranks_that_never_finish_meet_the_deadline(capsys):
    """Do ranks looping forever end at the deadline, each named with where it was?"""
    start = time.monotonic()
    with pytest.raises(launch.DeadlineExceeded, match="deadline of 4 s") as caught:
        run_gloo(spin_forever, world_size=2, timeout=60, deadline=4, report_every=2)
    assert time.monotonic() - start < 15
    assert caught.value.ranks == [0, 1]
    assert "rank 1: at test_launch.py" in str(caught.value)
    assert "in spin_forever" in str(caught.value)
    printed = capsys.readouterr().out   # the periodic line came before the end
    assert "[launch] still running after 2 s" in printed
    assert re.search(r"rank 0: running, at test_launch.py:\d+ in spin_forever", printed)


def test_periodic_report_says_which_ranks_finished(capsys):
    """While one rank works on, does the report say the other has finished?"""
    run_gloo(sleep_on_rank_one, world_size=2, args=(2.5,), timeout=30, report_every=1)
    printed = capsys.readouterr().out
    assert "rank 0: finished" in printed
    assert re.search(r"rank 1: running, at test_launch.py:\d+ in sleep_on_rank_one",
                     printed)


def test_timeout_inside_ddp_backward_is_a_collective_timeout():
    """Is gloo's timeout raised in DDP's backward (autograd's engine) a timeout?"""
    with pytest.raises(launch.CollectiveTimeout, match="Rank 0 waited more than 3 s"):
        run_gloo(uneven_ddp_steps, world_size=2, timeout=3)


@pytest.mark.parametrize("error", [TimeoutError("timed out waiting for my queue"),
                                   RuntimeError("Timed out: my own words")])
def test_a_workers_own_timeout_text_is_not_a_collective_timeout(error):
    """Is a worker's own error mentioning a timeout a WorkerError, not a timeout?"""
    with pytest.raises(launch.WorkerError, match="Rank 0 raised") as caught:
        run_gloo(raise_own_timeout, world_size=1, args=(error,))
    assert not isinstance(caught.value, launch.CollectiveTimeout)


def test_run_command_kills_the_whole_group_on_timeout(tmp_path):
    """Does a check's torchrun-style command leave no child behind on a timeout, even
    one in a session of its own (as torchrun starts its ranks)?"""
    from labkit.checks._programs import run_command

    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(600)'], start_new_session=True); "
              f"open({str(tmp_path / 'child.pid')!r}, 'w').write(str(child.pid)); "
              "time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([sys.executable, "-c", script], timeout=3)
    pids = _pids(tmp_path, "child.pid")
    assert len(pids) == 1 and _gone_within(pids, 5.0)
