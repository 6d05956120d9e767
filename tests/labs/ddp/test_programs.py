"""Lab 03's program checks: they pass on the notebook's solution modules and name
each classic mistake when one is made on purpose (the module written with a change).

Each test writes the modules a %%writefile cell of solutions/03_ddp.ipynb writes into
a temporary folder, breaks one line, and runs the check there (2 gloo ranks).
"""

import pytest
from notebook_cells import expect_hint, solution_folder, write_program

from labkit.checks import ExerciseFailed
from labkit.labs.ddp import checks

NOTEBOOK = "03_ddp.ipynb"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the solution's modules; the checks run from it."""
    return solution_folder(tmp_path, monkeypatch, NOTEBOOK,
                           ("allreduce_worker.py", "ddp_worker.py", "ddp_script.py"))



# ---------------------------------------------------------------- exercise 3.2


def test_allreduce_worker_passes_on_the_solution(folder, capsys):
    """Does 2-rank training with the solution's all-reduce equal one process?"""
    checks.allreduce_worker(str(folder / "allreduce_worker.py"))
    assert "✅ allreduce_worker: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("gradients summed, not averaged",
     [("        param.grad /= world_size                            # the mean\n", "")],
     "That is the SUM of the gradients"),
    ("no all-reduce at all",
     [("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)   # the sum, on every rank\n",
       ""), ("        param.grad /= world_size                            # the mean\n",
             "        pass\n")],
     "the replicas drifted apart"),
    ("every rank takes the whole batch",
     [("return images[rank::world_size], labels[rank::world_size]",
       "return images, labels")], "gives some samples to two ranks"),
    ("every rank takes the first half",
     [("return images[rank::world_size], labels[rank::world_size]",
       "return images[:len(images) // world_size], labels[:len(labels) // world_size]")],
     "gives some samples to two ranks"),
])
def test_allreduce_worker_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic all-reduce mistake get its own hint?"""
    path = write_program(folder, NOTEBOOK, "allreduce_worker.py", replace)
    expect_hint(checks.allreduce_worker, path, hint)


# ---------------------------------------------------------------- exercise 3.3


def test_ddp_worker_passes_on_the_solution(folder, capsys):
    """Does the solution's DDP worker equal one process and checkpoint correctly?"""
    checks.ddp_worker(str(folder / "ddp_worker.py"))
    assert "✅ ddp_worker: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("no set_epoch",
     [("        sampler.set_epoch(epoch)             # a new shuffle every epoch\n", "")],
     r"set_epoch with \[\], expected \[0, 1\]"),
    ("every rank reads the whole data set",
     [("DistributedSampler(dataset, shuffle=True, seed=seed)",
       "DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)")],
     "num_replicas=1, rank=0"),
    ("no DDP",
     [("        return DDP(model, device_ids=[device])   # one GPU per process\n"
       "    return DDP(model)                             # CPU ranks (gloo)\n",
       "        return model\n    return model\n")],
     "wrap the model in DistributedDataParallel"),
    ("no barrier before loading",
     [("    dist.barrier()                                     # nobody reads a half-written file\n",
       "")], "call dist.barrier\\(\\) on every rank after rank 0's torch.save"),
    ("every rank saves",
     [("    if ctx.rank == 0:\n        torch.save(model.module.state_dict(), path)",
       "    if True:\n        torch.save(model.module.state_dict(), path)")],
     r"rank\(s\) \[0, 1\] called torch.save"),
    ("no map_location",
     [("map_location=ctx.device, ", "")], "without map_location"),
    ("no checkpoint written",
     [("    if ctx.rank == 0:\n        torch.save(model.module.state_dict(), path)   # .module: no \"module.\" prefix\n"
       "    dist.barrier()                                     # nobody reads a half-written file\n"
       "    state = torch.load(path, map_location=ctx.device, weights_only=True)\n",
       "    state = model.module.state_dict()\n")],
     "no checkpoint was written to cfg.checkpoint"),
])
def test_ddp_worker_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic DDP-worker mistake get its own hint?"""
    path = write_program(folder, NOTEBOOK, "ddp_worker.py", replace)
    expect_hint(checks.ddp_worker, path, hint)


@pytest.mark.parametrize("save", [
    "torch.save(model.state_dict(), path)",
    'torch.save({"model": model.module.state_dict(), "epochs": 2}, path)',
])
def test_ddp_worker_accepts_other_checkpoint_forms(folder, capsys, save):
    """The module. prefix (PyTorch's tutorial) and a dict around the weights pass."""
    load = "    state = torch.load(path, map_location=ctx.device, weights_only=True)\n"
    read = load + ('    state = state["model"]\n' if '"model"' in save else "")
    path = write_program(folder, NOTEBOOK, "ddp_worker.py", [
        ("torch.save(model.module.state_dict(), path)", save), (load, read)])
    checks.ddp_worker(str(path))
    assert "✅ ddp_worker: passed" in capsys.readouterr().out


def test_plain_keys_strips_only_the_ddp_prefix():
    """Does plain_keys drop a leading 'module.' and nothing else?"""
    state = {"module.0.weight": 1, "0.bias": 2, "head.module.x": 3}
    assert checks.plain_keys(state) == {"0.weight": 1, "0.bias": 2, "head.module.x": 3}


# ---------------------------------------------------------------- exercise 3.4


def test_script_runs_the_worker_under_torchrun(folder, capsys):
    """Does the solution's script give one process's weights under torchrun?"""
    checks.ddp_under_torchrun(str(folder / "ddp_script.py"),
                              str(folder / "ddp_worker.py"))
    assert "✅ ddp_under_torchrun: passed" in capsys.readouterr().out


@pytest.mark.parametrize("choice", ["torch.cuda.device_count() > local_rank",
                                    "torch.cuda.is_available()"])
def test_script_choosing_the_backend_per_process_is_named(folder, choice):
    """A per-process choice (NCCL on rank 0, gloo on rank 1 on one GPU) or NCCL on too
    few GPUs is named from the faked nodes, before torchrun runs."""
    path = write_program(folder, NOTEBOOK, "ddp_script.py", [
        ("torch.cuda.device_count() >= local_world_size", choice)])
    expect_hint(lambda p: checks.ddp_under_torchrun(p, str(folder / "ddp_worker.py")),
                path, "ONE backend|a GPU of its own")


def test_faked_nodes_see_the_per_job_rule(folder):
    """On faked nodes with 0, 1 and 2 GPUs, the solution chooses gloo, gloo, NCCL."""
    from labkit.checks._programs import load_program

    module = load_program(folder / "ddp_script.py")
    chosen = {}
    for gpus in (0, 1, 2):
        for local_rank in (0, 1):
            seen = {}
            with checks._fake_node(module, gpus, local_rank, 2, seen):
                ctx = module.setup_from_env()
            chosen[gpus, local_rank] = (seen["backend"], str(ctx.device), seen.get("set"))
    assert chosen[0, 1] == chosen[1, 0] == chosen[1, 1] == ("gloo", "cpu", None)
    assert chosen[2, 1][:2] == ("nccl", "cuda:1") and str(chosen[2, 1][2]) == "cuda:1"
    assert checks._device_choices("x", module) == ""


def test_script_without_init_process_group_is_named(folder):
    """Does a script that never joins the group get the init_process_group hint?"""
    path = write_program(folder, NOTEBOOK, "ddp_script.py", [
        ('    dist.init_process_group(backend, init_method="env://",   # MASTER_ADDR/PORT too\n'
         '                            device_id=device if backend == "nccl" else None)\n',
         "")])
    with pytest.raises(ExerciseFailed, match="init_process_group"):
        checks.ddp_under_torchrun(str(path), str(folder / "ddp_worker.py"))


# ---------------------------------------------------------------- the lab's measurements


def _module(folder, name):
    """Import a module the notebook writes, from ``folder`` (ranks import it too)."""
    from labkit.checks._programs import load_program

    return load_program(write_program(folder, NOTEBOOK, name))


def test_ddp_worker_equals_one_process_on_four_ranks(folder):
    """Do 4 ranks x 16 images give one process's weights with 64 (to 1e-5)?"""
    from labkit import launch, models

    worker = _module(folder, "ddp_worker.py")
    cfg = worker.Config(epochs=1, limit=512, batch_per_rank=16,
                        checkpoint=str(folder / "four.pt"))
    loaded = launch.run(worker.train, 4, args=(cfg,), backend="gloo", timeout=120)
    want = checks.one_process_reference(cfg, world_size=4)
    assert all(models.max_difference(want, w) < checks.TOLERANCE for w in loaded)
    other = checks.one_process_reference(cfg, world_size=2)   # the test can fail
    assert models.max_difference(other, loaded[0]) > 100 * checks.TOLERANCE


def test_collectives_give_sum_copy_and_list(folder):
    """Do all-reduce, broadcast and all-gather return what section 1 prints?"""
    from labkit import launch

    seen = launch.run(_module(folder, "collectives_demo.py").collectives, 2,
                      backend="gloo")
    assert all(r["all_reduce"] == 3.0 and r["broadcast"] == 100.0 for r in seen)
    assert all(r["all_gather"] == [0.0, 10.0] for r in seen)


def test_buckets_and_no_sync_measure_what_the_text_says(folder):
    """Fewer buckets with a bigger cap, a 1 MiB first bucket, no_sync: 1 all-reduce."""
    from labkit import launch

    measure = _module(folder, "ddp_measure.py")
    small, large, default = (launch.run(measure.buckets, 2, args=(cap,),
                                        backend="gloo")[0] for cap in (0.25, 25.0, None))
    assert len(small["mb"]) > len(large["mb"]) == 1
    assert len(default["mb"]) == 2 and default["mb"][0] <= 1.05
    assert small["hidden"] > 0 == large["hidden"], "one bucket cannot overlap"
    acc = launch.run(measure.accumulate, 2, backend="gloo")[0]
    assert acc["allreduces"] == {"plain": 4, "no_sync": 1}
    assert acc["max_grad_gap"] < 1e-6


def test_equivalence_breakers_measure_the_breaks(folder):
    """BatchNorm breaks equality and GroupNorm keeps it; shared seeds share masks;
    padding double-counts; Join finishes uneven ranks and no Join times out."""
    from labkit import launch, models

    breakers = _module(folder, "equivalence_breakers.py")
    gaps = {norm: models.max_difference(
        breakers.one_process(norm),
        launch.run(breakers.normalisation, 2, args=(norm,), backend="gloo")[0])
        for norm in ("batch", "group")}
    assert gaps["group"] < checks.TOLERANCE < 100 * checks.TOLERANCE < gaps["batch"]
    same = launch.run(breakers.dropout_masks, 2, args=(False,), backend="gloo")
    apart = launch.run(breakers.dropout_masks, 2, args=(True,), backend="gloo")
    assert (same[0] == same[1]).all() and (apart[0] == apart[1]).float().mean() < 0.6
    score = launch.run(breakers.padded_evaluation, 2, args=(9,), backend="gloo")[0]
    assert (score["counted"], score["unique"]) == (10, 9)
    assert score["exact"] == pytest.approx(1 / 3, abs=1e-6)
    assert score["accuracy"] == pytest.approx(0.4, abs=1e-6)
    joined = launch.run(breakers.uneven_batches, 2, args=(True,), backend="gloo")
    assert [r["batches"] for r in joined] == [5, 4]
    with pytest.raises(launch.CollectiveTimeout):
        launch.run(breakers.uneven_batches, 2, args=(False,), backend="gloo", timeout=3)


def test_bucket_timings_use_cuda_events_on_a_gpu(folder, monkeypatch):
    """On a CUDA device, stamp() records a CUDA event and seconds_between() reads the
    events' elapsed time (NCCL's futures finish at enqueue, so a host clock would
    not do); on the CPU both stay the host clock. A fake Event stands in for CUDA."""
    import torch

    measure = _module(folder, "ddp_measure.py")
    recorded = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream=None):
            self.at = len(recorded)
            recorded.append(self)

        def elapsed_time(self, end):   # milliseconds, as CUDA reports them
            return 250.0 * (end.at - self.at)

    monkeypatch.setattr(measure.torch.cuda, "Event", FakeEvent)
    start, end = measure.stamp(torch.device("cuda", 0)), measure.stamp(torch.device("cuda", 0))
    assert isinstance(start, FakeEvent) and recorded == [start, end]
    assert measure.seconds_between(start, end) == pytest.approx(0.25)
    first, second = measure.stamp(torch.device("cpu")), measure.stamp(torch.device("cpu"))
    assert isinstance(first, float) and 0 <= measure.seconds_between(first, second) < 1


def test_evaluation_tensors_live_on_the_rank_device(folder, monkeypatch):
    """padded_evaluation hands the collectives tensors on ctx.device (NCCL has no CPU
    tensors): checked with the meta device and fake collectives."""
    import torch
    import torch.distributed as dist

    from labkit.launch import RankContext

    breakers = _module(folder, "equivalence_breakers.py")
    devices = []

    class Stop(Exception):
        pass

    def all_reduce(tensor, *args, **kwargs):
        devices.append(tensor.device)

    def all_gather(out, tensor, *args, **kwargs):
        devices.extend([tensor.device, *(t.device for t in out)])
        raise Stop

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(breakers.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(breakers.dist, "all_gather", all_gather)
    ctx = RankContext(0, 2, 0, "nccl", torch.device("meta"))
    with pytest.raises(Stop):
        breakers.padded_evaluation(ctx, 9)
    assert devices and all(d.type == "meta" for d in devices)


# ---------------------------------------------------------------- on 2 GPUs (NCCL)


@pytest.mark.gpu(2)
def test_buckets_and_no_sync_on_nccl(folder):
    """Lab 03's bucket measurement on 2 GPUs: the same buckets as on gloo, each
    all-reduce timed on CUDA events (NCCL's futures finish at enqueue: a host clock
    would read 0), and no_sync's one all-reduce?"""
    from labkit import launch

    measure = _module(folder, "ddp_measure.py")
    small, large, default = (
        launch.run(measure.buckets, 2, args=(cap,), backend="nccl")[0]
        for cap in (0.25, 25.0, None))
    assert len(small["mb"]) > len(large["mb"]) == 1
    assert len(default["mb"]) == 2 and default["mb"][0] <= 1.05
    assert all(done > ready >= 0 for ready, done in small["spans_ms"])
    acc = launch.run(measure.accumulate, 2, backend="nccl")[0]
    assert acc["allreduces"] == {"plain": 4, "no_sync": 1}
    assert acc["max_grad_gap"] < 1e-5
