"""Lab 07 (ZeRO, FSDP2, checkpointing, DCP): do the sharded runs equal DDP, does each
rank hold its 1/N share, does a checkpoint round-trip, and does each classic mistake
get its hint?

The programs are the solution notebook's own ``%%writefile`` modules, written to a
temporary folder (``notebook_cells.write_program``), sometimes with a mistake.
"""

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F
from notebook_cells import write_program
from torch.utils.checkpoint import checkpoint

from labkit import launch, memory_probe, models
from labkit.checks._core import ExerciseFailed
from labkit.labs.sharding import checks, explorer, sharded, sharding_memory

NOTEBOOK = "07_sharding.ipynb"
MODULES = ("zero1_worker.py", "zero_variants.py", "fsdp_worker.py", "stage_bytes.py",
           "dcp_demo.py", "fsdp_pitfalls.py", "fsdp_extras.py")


@pytest.fixture
def programs(tmp_path, monkeypatch):
    """The notebook's modules, written to tmp_path and importable (ranks too)."""
    for name in MODULES:
        write_program(tmp_path, NOTEBOOK, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in MODULES:
        sys.modules.pop(name[:-3], None)
    importlib.invalidate_caches()
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name[:-3], None)


def _broken(tmp_path, module, old, new):
    return write_program(tmp_path, NOTEBOOK, module, replace=[(old, new)])


# ---------------------------------------------------------------- equality with DDP


def test_zero1_from_scratch_equals_ddp_adam(programs):
    """Does the notebook's ZeRO-1 worker give DDP + Adam's weights, on every rank?"""
    module = importlib.import_module("zero1_worker")
    ranks = launch.run(checks.zero1_harness, 2, args=(module.__name__, checks.CONFIG),
                       backend="gloo", timeout=60)
    for result in ranks:
        gap = models.max_difference(result["reference"]["weights"], result["weights"])
        assert gap <= checks.TOLERANCE


def test_fsdp2_equals_ddp(programs):
    """Does FSDP2 (fully_shard per block, then the root) give DDP + Adam's weights?"""
    module = importlib.import_module("fsdp_worker")
    ranks = launch.run(checks.fsdp_harness, 2, args=(module.__name__, checks.CONFIG),
                       backend="gloo", timeout=60)
    for result in ranks:
        gap = models.max_difference(result["reference"]["weights"], result["weights"])
        assert gap <= checks.TOLERANCE
        assert result["yours"] == result["measured"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_state_bytes_are_the_formula_share(programs, world_size):
    """Is each rank's state within 10 % of the formula's 1/N share, for every stage?"""
    stage_bytes = importlib.import_module("stage_bytes")
    cfg = sharded.TrainConfig(steps=2, global_batch=32, width=64, depth=4)
    ranks = launch.run(stage_bytes.measure, world_size, args=(cfg,), backend="gloo",
                       timeout=120)
    num_params = models.count_parameters(sharded.block_mlp(cfg.width, cfg.depth))
    widths = {"ZeRO-1 (yours)": (4, 4, 12), "ZeRO-2": (4, 4, 12)}
    for rank in ranks:
        for name, result in rank.items():
            if name == "ZeroRedundancyOptimizer":
                continue   # whole parameters per rank: uneven by design (the lab says)
            want = sharding_memory.zero_bytes_per_rank(
                num_params, world_size, result["stage"], *widths.get(name, (4, 4, 8)))
            for kind in sharding_memory.KINDS:
                assert result["held"][kind] == pytest.approx(want[kind], rel=0.10), (
                    name, kind)
            gap = models.max_difference(rank["DDP"]["weights"], result["weights"])
            assert gap <= checks.TOLERANCE, name


def test_dcp_two_ranks_to_one_round_trips_exactly(programs, tmp_path):
    """Does a DCP checkpoint from 2 ranks load exactly on 1 process and resharded?"""
    import torch.distributed.checkpoint as dcp

    dcp_demo = importlib.import_module("dcp_demo")
    cfg = sharded.TrainConfig(steps=2, global_batch=32, width=32, depth=2)
    folder = str(tmp_path / "checkpoint")
    saved = launch.run(dcp_demo.save, 2, args=(cfg, folder), backend="gloo",
                       timeout=60)[0]
    plain = sharded.block_mlp(cfg.width, cfg.depth)
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    plain.load_state_dict(state["model"])
    assert models.max_difference(saved["full"], plain.state_dict()) == 0.0
    again = launch.run(dcp_demo.load, 2, args=(cfg, folder, True), backend="gloo",
                       timeout=60)[0]
    assert models.max_difference(saved["full"], again["full"]) == 0.0
    assert again["local"]["embed.weight"] == (cfg.width, 392)   # last dim sharded
    assert again["adam_step"] == cfg.steps


def test_pitfalls_behave_as_the_lab_says(programs):
    """Root only: one all-gather of everything; blocks only: the mixed-DTensor error."""
    pitfalls = importlib.import_module("fsdp_pitfalls")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=16, depth=2)
    seen = launch.run(pitfalls.run_all, 2, args=(cfg,), backend="gloo", timeout=60)[0]
    num_bytes = 4 * models.count_parameters(sharded.block_mlp(16, 2))
    assert seen["root only"] == (1, num_bytes)
    assert seen["per block"][0] == 1 + 2 * cfg.depth   # root once, each block twice
    assert "got mixed torch.Tensor and DTensor" in seen["blocks only + clip_grad_norm_"]
    assert seen["optimizer before fully_shard"] == 0.0


_FREED_PROBE = """
import weakref

import stage_bytes

_seen = []


def _first(ctx, cfg):
    model, optimizer = stage_bytes.fsdp_worker.train(ctx, cfg)
    _seen.append(weakref.ref(next(iter(model.parameters()))))
    return model, optimizer


def _second(ctx, cfg):
    _seen.append(_seen[0]() is None)    # the first variant's model: gone already?
    return stage_bytes.train_ddp(ctx, cfg)


def run(ctx, cfg):
    stage_bytes.VARIANTS = {"FSDP2 (yours)": (3, _first), "DDP": (0, _second)}
    results = stage_bytes.measure(ctx, cfg)
    return {"freed": _seen[1], "names": list(results)}
"""


def test_measure_frees_each_variant_before_the_next(programs):
    """Is a variant's model gone before the next one trains (and its peak is read)?

    On GPUs a model still alive would count in the next variant's
    max_memory_allocated; here its parameters' weak reference must be dead.
    """
    (programs / "freed_probe.py").write_text(_FREED_PROBE)
    probe = importlib.import_module("freed_probe")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=16, depth=2)
    ranks = launch.run(probe.run, 2, args=(cfg,), backend="gloo", timeout=60)
    assert all(r["freed"] for r in ranks)
    assert ranks[0]["names"] == ["FSDP2 (yours)", "DDP"]
    sys.modules.pop("freed_probe", None)


def test_collectives_exist_in_older_torch_too():
    """Do the notebook's modules call only collective names torch 2.6 has?

    torch >= 2.13 adds all_gather_single / reduce_scatter_single; pyproject says
    torch >= 2.6, so the lab uses all_gather_into_tensor / reduce_scatter_tensor.
    """
    from notebook_cells import program_source

    for module in MODULES:
        source = program_source(NOTEBOOK, module)
        assert "all_gather_single" not in source, module
        assert "reduce_scatter_single" not in source, module


def test_ranks_importing_sharded_do_not_repeat_the_rename_warning():
    """Do the old collective names stay quiet where the lab's ZeRO workers run?

    torch >= 2.13 warns on all_gather_into_tensor / reduce_scatter_tensor; the
    lab keeps them (torch 2.6) and explains the warning, so ``sharded`` (which
    every ZeRO worker imports) silences exactly those two messages when imported
    (under pytest, the filters of collection time are gone: call it here).
    """
    import warnings

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sharded.quiet_renamed_collectives()   # what importing sharded does
            dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2))
            dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2))
            warnings.warn("another FutureWarning", FutureWarning)
    finally:
        dist.destroy_process_group()
    assert [str(w.message) for w in caught] == ["another FutureWarning"]


def test_stage_launches_use_the_labs_one_backend(monkeypatch, capsys):
    """On 2 GPUs (faked): every N runs on NCCL, N = 4 is left out, the peaks print.

    Before, N = 1 and 2 ran NCCL and N = 4 gloo (``peak`` None: a TypeError in the
    peaks cell); on 1 GPU, N = 1 ran on the GPU and N = 2 on CPUs.
    """
    import types

    from notebook_cells import code_cells

    cells = code_cells(NOTEBOOK)
    run_cell = next(c for c in cells if "launch.run(stage_bytes.measure" in c)
    peak_cell = next(c for c in cells if "max_memory_allocated" in c
                     and "peaks" in c)
    names = {"DDP": 0, "ZeRO-1 (yours)": 1, "ZeroRedundancyOptimizer": 1,
             "ZeRO-2": 2, "FSDP2 (yours)": 3}
    launches = []

    def fake_run(worker, world_size, args=(), backend="auto", **kwargs):
        launches.append((world_size, backend))
        peak = 2**20 if backend == "nccl" else None
        rank = {name: {"stage": stage, "peak": peak, "sent": 1.0, "weights": {},
                       "held": dict.fromkeys(sharding_memory.KINDS, 1)}
                for name, stage in names.items()}
        return [rank] * world_size

    monkeypatch.setattr(launch, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    namespace = {"sharded": sharded, "labkit": __import__("labkit"), "torch": torch,
                 "checks": types.SimpleNamespace(solved=lambda key: None),
                 "launch": launch, "models": models, "backend": "nccl",
                 "GiB": 2**30, "load_program": lambda path: types.SimpleNamespace(
                     measure=lambda ctx, cfg: None)}
    exec(run_cell, namespace)
    assert launches == [(1, "nccl"), (2, "nccl")]
    exec(peak_cell, namespace)
    assert "peak MiB on the fullest rank" in capsys.readouterr().out


# ---------------------------------------------------------------- appendix: FSDP2 options


def test_mixed_precision_halves_the_gathers_not_the_state(programs):
    """bf16 all-gathers carry half the bytes; each rank keeps the same fp32 state."""
    extras = importlib.import_module("fsdp_extras")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=16, depth=2)
    runs = launch.run(extras.mixed_precision, 2, args=(cfg,), backend="gloo",
                      timeout=60)[0]
    fp32, bf16 = runs["fp32"], runs["bf16 params, fp32 reduce"]
    low = runs["bf16 params, bf16 reduce"]
    assert bf16["comm"]["all-gather"][1] * 2 == fp32["comm"]["all-gather"][1]
    assert bf16["comm"]["reduce-scatter"] == fp32["comm"]["reduce-scatter"]
    assert low["comm"]["reduce-scatter"][1] * 2 == fp32["comm"]["reduce-scatter"][1]
    assert bf16["compute"] == "torch.bfloat16" and fp32["compute"] == "torch.float32"
    assert bf16["held"] == fp32["held"] == low["held"]
    assert bf16["shard"] == bf16["grad"] == "torch.float32"


def test_meta_init_holds_only_the_shard(programs):
    """Meta-device init: no bytes before to_empty, then 1/N, with nn.Linear's init."""
    extras = importlib.import_module("fsdp_extras")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=32, depth=2)
    for rank in launch.run(extras.meta_init, 2, args=(cfg,), backend="gloo",
                           timeout=60):
        assert rank["on_meta"]
        assert rank["held"] == pytest.approx(rank["whole"] / 2, rel=0.02)
        assert rank["std"] == pytest.approx(rank["kaiming_std"], rel=0.1)


def test_reshard_after_forward_and_hsdp_on_four_ranks(programs):
    """True: 1/4 kept, gathered again; 2: 1/2; False: whole, no backward gather;
    HSDP: each rank twice FSDP's share, an all-reduce across replicas, same weights."""
    extras = importlib.import_module("fsdp_extras")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=16, depth=2)
    seen = launch.run(extras.reshard, 4, args=(cfg,), backend="gloo", timeout=60)[0]
    whole = seen["False"]["kept"]
    assert seen["True"]["kept"] == pytest.approx(whole / 4, rel=0.05)
    assert seen["2"]["kept"] == pytest.approx(whole / 2, rel=0.05)
    assert seen["True"]["backward"]["all-gather"][0] == cfg.depth
    assert "all-gather" not in seen["False"]["backward"]
    hybrid = launch.run(extras.hsdp, 4, args=(cfg,), backend="gloo", timeout=60)[0]
    assert hybrid["HSDP"]["placements"] == "(Replicate(), Shard(dim=0))"
    assert hybrid["HSDP"]["held"] == pytest.approx(2 * hybrid["FSDP"]["held"], rel=0.1)
    assert "all-reduce" in hybrid["HSDP"]["comm"]
    assert "all-reduce" not in hybrid["FSDP"]["comm"]
    assert hybrid["gap"] < 1e-3


def test_async_save_keeps_the_state_at_the_call(programs, tmp_path):
    """dcp.async_save on its own gloo group: the checkpoint is the state at the call."""
    extras = importlib.import_module("fsdp_extras")
    cfg = sharded.TrainConfig(steps=1, global_batch=8, width=16, depth=2)
    saved = launch.run(extras.async_save, 2, args=(cfg, str(tmp_path / "async")),
                       backend="gloo", timeout=60)[0]
    assert saved["gap"] == 0.0
    assert saved["returned_s"] <= saved["written_s"]


# ---------------------------------------------------------------- hints: ZeRO-1


@pytest.mark.parametrize("old, new, hint", [
    ("    per_rank = -(-numel // world_size)               # ceil(numel / world_size)",
     "    per_rank = numel // world_size", "round the length up"),
    ("    dist.all_reduce(grads)" + " " * 34 + "# sum over the ranks ...",
     "", "No all_reduce"),
    ("    dist.all_gather_into_tensor(gathered, shard.detach())"
     "   # every rank's new slice\n"
     "    with torch.no_grad():\n"
     "        vector_to_parameters(gathered[:numel], params)",
     """    mine = flatten([p.detach() for p in params], ctx.world_size)
    mine[start:stop] = shard.detach()
    with torch.no_grad():
        vector_to_parameters(mine[:numel], params)""", "No all-gather"),
    ("    return shard, torch.optim.Adam([shard], lr=lr)",
     "    return shard, torch.optim.Adam([shard, *model.parameters()], lr=lr)",
     "give it only this rank's shard"),
])
def test_zero1_mistakes_get_their_hint(tmp_path, old, new, hint):
    """Do the classic ZeRO-1 mistakes get their own hint?"""
    path = _broken(tmp_path, "zero1_worker.py", old, new)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.zero1_worker(path)


# ---------------------------------------------------------------- hints: FSDP2

_WRAP = """    for block in model.blocks:
        fully_shard(block, mesh=mesh)    # one all-gather per block, freed after use
    fully_shard(model, mesh=mesh)        # the root: embed and head, and the hooks"""


@pytest.mark.parametrize("old, new, hint", [
    (_WRAP, "    fully_shard(model, mesh=mesh)", "on the root only"),
    (_WRAP, "    for block in model.blocks:\n        fully_shard(block, mesh=mesh)",
     "root model is not an FSDPModule"),
    (_WRAP, "    fully_shard(model, mesh=mesh)\n    for block in model.blocks:\n"
            "        fully_shard(block, mesh=mesh)", "bottom-up"),
    ("        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]",
     "        local = list(tensors)", "global size"),
])
def test_fsdp_mistakes_get_their_hint(tmp_path, old, new, hint):
    """Root only, blocks only, root first, global numel: each named?"""
    path = _broken(tmp_path, "fsdp_worker.py", old, new)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.fsdp_worker(path)


def test_program_checks_pass_on_the_solution(tmp_path, capsys):
    """Do both program checks print their pass line on the notebook's modules?"""
    checks.zero1_worker(write_program(tmp_path, NOTEBOOK, "zero1_worker.py"))
    checks.fsdp_worker(write_program(tmp_path, NOTEBOOK, "fsdp_worker.py"))
    assert capsys.readouterr().out.count("✅") == 2


# ---------------------------------------------------------------- exercise 7.1


def _mistaken(shard_from):
    """A per-stage formula that shards each kind from the stage given."""
    def fn(num_params, world_size, stage, param_bytes=2, grad_bytes=2,
           optimizer_bytes=12):
        sharding_memory.zero_bytes_per_rank(num_params, world_size, stage)  # ValueError
        n = lambda kind: world_size if stage >= shard_from[kind] else 1  # noqa: E731
        return {"parameters": num_params * param_bytes / n("parameters"),
                "gradients": num_params * grad_bytes / n("gradients"),
                "optimizer states":
                    num_params * optimizer_bytes / n("optimizer states")}
    return fn


@pytest.mark.parametrize("shard_from, hint", [
    ({"optimizer states": 1, "gradients": 1, "parameters": 3}, "whole on every rank"),
    ({"optimizer states": 1, "gradients": 2, "parameters": 4}, "sharded"),
    ({"optimizer states": 2, "gradients": 2, "parameters": 3}, "ZeRO-1"),
])
def test_formula_mistakes_get_their_hint(shard_from, hint):
    """Gradients sharded at stage 1, parameters never, optimizer from stage 2?"""
    with pytest.raises(ExerciseFailed, match=hint):
        checks.bytes_per_rank(_mistaken(shard_from))


def test_formula_needs_a_value_error_and_a_dict(capsys):
    """Are a missing ValueError and a total instead of a dict named; does ours pass?"""
    right = _mistaken({"optimizer states": 1, "gradients": 2, "parameters": 3})
    checks.bytes_per_rank(right)
    assert "✅" in capsys.readouterr().out

    def no_error(num_params, world_size, stage, *widths):
        return sharding_memory.zero_bytes_per_rank(num_params, world_size,
                                                   min(max(stage, 0), 3), *widths)

    with pytest.raises(ExerciseFailed, match="raise ValueError"):
        checks.bytes_per_rank(no_error)
    with pytest.raises(ExerciseFailed, match="return a dict"):
        checks.bytes_per_rank(lambda *a: sum(right(*a).values()))


# ---------------------------------------------------------------- exercise 7.4


def _plain(model, images):
    return model(images)


def _one_segment(model, images):
    def blocks(x):
        for block in model.blocks:
            x = block(x)
        return x
    x = model.embed(images.flatten(1))
    return model.head(checkpoint(blocks, x, use_reentrant=False))


def _reentrant_embed(model, images):
    x = checkpoint(model.embed, images.flatten(1), use_reentrant=True)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return model.head(x)


def _no_flatten(model, images):
    x = model.embed(images)                      # (B, 1, 28, 28) into Linear(784, d)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return model.head(x)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("fn, hint", [(_plain, "like without checkpointing"),
                                      (_one_segment, "one segment"),
                                      (_reentrant_embed, "got no gradient"),
                                      (_no_flatten, r"images\.flatten\(1\)")])
def test_checkpoint_mistakes_get_their_hint(fn, hint):
    """No checkpointing, one segment for all blocks, reentrant on the embed, images
    not flattened for the embed: each named?"""
    with pytest.raises(ExerciseFailed, match=hint):
        checks.checkpointed_forward(fn)


# ---------------------------------------------------------------- labkit plumbing


def test_zero_table_matches_the_paper():
    """Does the formula give the ZeRO paper's Table 1 (7.5 B, K = 12, GB)?"""
    paper = {4: (52.5, 41.3, 30), 64: (31.4, 16.6, 1.88), 1024: (30.1, 15.1, 0.12)}
    for n, row in paper.items():
        for stage, gb in zip((1, 2, 3), row):
            got = sharding_memory.per_gpu_bytes(7.5e9, n, stage) / 1e9
            assert got == pytest.approx(gb, abs=0.05)


@pytest.mark.parametrize("args", [(10, 2, 4), (10, 0, 1), (10, 1.5, 1), (-1, 2, 1)])
def test_formula_refuses_bad_input(args):
    """Are a bad stage, world size or parameter count a ValueError naming them?"""
    with pytest.raises(ValueError, match="stage|world_size|num_params"):
        sharding_memory.zero_bytes_per_rank(*args)


def test_state_bytes_of_a_plain_adam_step():
    """Does state_bytes count 4 + 4 + 8 bytes per parameter after an fp32 Adam step?"""
    model = sharded.block_mlp(8, 1)
    optimizer = torch.optim.Adam(model.parameters())
    images, labels = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()
    n = models.count_parameters(model)
    assert sharding_memory.state_bytes(model, optimizer) == {
        "parameters": 4 * n, "gradients": 4 * n, "optimizer states": 8 * n}


def test_activation_estimate_and_its_errors():
    """Korthikanti's bytes per layer; checkpointed: inputs + one layer; bad input."""
    per_layer = 2048 * 1 * 5120 * (34 + 5 * 40 * 2048 / 5120)
    full = sharding_memory.transformer_activation_bytes(36, 5120, 40, 2048, 1)
    assert full == pytest.approx(36 * per_layer)
    kept = sharding_memory.transformer_activation_bytes(36, 5120, 40, 2048, 1, True)
    assert kept == pytest.approx(36 * 2 * 2048 * 5120 + per_layer)
    with pytest.raises(ValueError, match="seq_len"):
        sharding_memory.transformer_activation_bytes(36, 5120, 40, 0, 1)


def test_step_memory_sees_the_saved_activations():
    """Does the live-tensor probe find ~40 B d bytes per block, fewer checkpointed?"""
    torch.manual_seed(0)
    model = sharded.block_mlp(64, 4)
    images, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    plain = memory_probe.step_memory(model, images, labels)
    assert plain["after_forward"] == pytest.approx(4 * 40 * 32 * 64, rel=0.1)
    assert plain["peak"] >= plain["after_forward"]
    saved = memory_probe.step_memory(model, images, labels, forward=_one_segment)
    assert saved["after_forward"] < plain["after_forward"] / 4
    assert memory_probe.step_seconds(model, images, labels, repeats=1) > 0


def test_ring_bytes_shares():
    """All-gather, reduce-scatter, broadcast: (N-1)/N; all-reduce: 2(N-1)/N."""
    log = [("all-gather", 100), ("reduce-scatter", 100), ("broadcast", 100),
           ("all-reduce", 100)]
    assert memory_probe.ring_bytes(log, 4) == pytest.approx(0.75 * 100 * 5)


def test_training_data_is_split_evenly():
    """Do ranks' slices make up the global batch, and an uneven split fail clearly?"""
    cfg = sharded.TrainConfig(steps=2, global_batch=8)
    whole = list(sharded.rank_batches(cfg, 0, 1))
    halves = [list(sharded.rank_batches(cfg, r, 2)) for r in range(2)]
    for step in range(2):
        joined = torch.cat([halves[0][step][0], halves[1][step][0]])
        assert torch.equal(joined, whole[step][0])
    with pytest.raises(ValueError, match="multiple of 3"):
        next(sharded.rank_batches(cfg, 0, 3))
    with pytest.raises(ValueError, match="width"):
        sharded.block_mlp(0, 2)


def test_fit_explorer_builds_and_sums():
    """Does the does-it-fit explorer build, and its parts add up to per_gpu_bytes?"""
    box = explorer.sharding_fit(capacity_gib=139.0)
    assert box.children
    shape = sharding_memory.MODEL_SHAPES["Llama 2 7B"]
    parts = explorer._fit_parts(shape, 8, 3, 2048, 1, False)
    acts = sharding_memory.transformer_activation_bytes(*shape[1:], 2048, 1)
    want = sharding_memory.per_gpu_bytes(shape[0], 8, 3, acts) / 2**30
    assert sum(parts.values()) == pytest.approx(want)


# ---------------------------------------------------------------- GPUs (not run here)


@pytest.mark.gpu(2)
def test_fsdp2_peak_is_below_ddp_on_gpus(programs):
    """On 2 GPUs (NCCL): FSDP2 holds 1/2 of DDP and peaks below it (allocator)?"""
    stage_bytes = importlib.import_module("stage_bytes")
    cfg = sharded.TrainConfig(steps=2, global_batch=32, width=512, depth=4)
    ranks = launch.run(stage_bytes.measure, 2, args=(cfg,), backend="nccl",
                       timeout=120)
    for rank in ranks:
        ddp, fsdp = rank["DDP"], rank["FSDP2 (yours)"]
        assert sum(fsdp["held"].values()) == pytest.approx(
            sum(ddp["held"].values()) / 2, rel=0.1)
        assert fsdp["peak"] < ddp["peak"]
        assert models.max_difference(ddp["weights"], fsdp["weights"]) <= \
            sharded.WEIGHT_TOLERANCE["cuda"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_checkpointing_lowers_the_cuda_peak():
    """On a GPU, does max_memory_allocated drop with a checkpointed forward?"""
    torch.manual_seed(0)
    model = sharded.block_mlp(256, 8).cuda()
    images = torch.randn(256, 1, 28, 28, device="cuda")
    labels = torch.randint(0, 10, (256,), device="cuda")

    def per_block(model, images):
        x = model.embed(images.flatten(1))
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return model.head(x)

    plain = memory_probe.step_memory(model, images, labels)
    saved = memory_probe.step_memory(model, images, labels, forward=per_block)
    assert saved["peak"] < 0.6 * plain["peak"]


def test_allocator_peak_is_above_the_start_and_after_the_workspaces(monkeypatch):
    """On a (faked) GPU: are cuBLAS's workspaces allocated before the start is read,
    and is the peak the block's own bytes, the start's subtracted?"""
    calls, held = [], {"now": 300, "peak": 0}
    fake = {"synchronize": lambda device=None: None,
            "empty_cache": lambda: calls.append("empty_cache"),
            "memory_allocated": lambda device=None: held["now"],
            "reset_peak_memory_stats":
                lambda device=None: held.update(peak=held["now"]),
            "max_memory_allocated": lambda device=None: held["peak"]}
    for name, function in fake.items():
        monkeypatch.setattr(torch.cuda, name, function)

    def warm(device):   # cuBLAS's workspaces: 200 bytes kept by the process
        calls.append("warm")
        held["now"] += 200
    monkeypatch.setattr(memory_probe, "_warm_cuda_workspaces", warm)
    with memory_probe.allocator_peak(torch.device("cuda", 0)) as peak:
        held["peak"] = held["now"] + 4096   # the block's training allocates 4 KiB
        assert peak.bytes is None
    assert calls == ["warm", "empty_cache"]
    assert peak.bytes == 4096


def test_allocator_peak_is_none_on_cpu():
    """CPU ranks: no allocator statistics, so no figure (not a zero)."""
    with memory_probe.allocator_peak(torch.device("cpu")) as peak:
        torch.ones(1000)
    assert peak.bytes is None
