"""Lab 08 (tensor parallelism): the split models equal the unsplit ones, the checks
pass on the notebook's solutions and name each classic mistake made on purpose, and
the latency model and the helpers keep their promises.

Program tests write the module a %%writefile cell of solutions/08_tensor_parallel.ipynb
writes into a temporary folder, optionally with one line broken, and run the check
there (2 gloo ranks; 4 for the 2-D mesh).
"""

import math

import pytest
import torch
from notebook_cells import expect_hint, solution_folder, write_program

from labkit import launch, models
from labkit.checks import ExerciseFailed
from labkit.checks._programs import load_program
from labkit.labs.tensor_parallel import checks, latency_model
from labkit.labs.tensor_parallel import tensor_parallel as tp

NOTEBOOK = "08_tensor_parallel.ipynb"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the solution's modules; the checks run from it."""
    return solution_folder(tmp_path, monkeypatch, NOTEBOOK,
                           ("tp_mlp.py", "tp_block.py", "dp_tp.py", "api_demo.py"))



# ---------------------------------------------------------------- exercise 8.1


def test_from_scratch_mlp_equals_unsplit(folder, capsys):
    """Do 2 ranks of the solution's Megatron MLP give the unsplit outputs, gradients?"""
    checks.tp_mlp(str(folder / "tp_mlp.py"))
    assert "✅ tp_mlp: passed" in capsys.readouterr().out


G_FORWARD = ("        total = partial.clone()\n"
             "        dist.all_reduce(total)   # sum over ranks, the result on every "
             "rank\n        return total\n")
F_BACKWARD = ("        grad = grad.clone()      # all_reduce works in place: not "
              "autograd's tensor\n"
              "        dist.all_reduce(grad)    # the paths through every rank's "
              "hidden features\n"
              "        return grad\n")


@pytest.mark.parametrize("mistake, replace, hint", [
    ("forgot the all-reduce", [(G_FORWARD, "        return partial.clone()\n")],
     "off by exactly the other ranks' share"),
    ("bias on every rank, before the sum",
     [("        partial = F.linear(h, self.weight)           # (B, out): this rank's "
       "share\n        return ReduceFromParallel.apply(partial) + self.bias",
       "        return ReduceFromParallel.apply(F.linear(h, self.weight, self.bias))")],
     "counted 2 times"),
    ("fc1 split by input features",
     [("k = full.out_features // world_size", "k = full.in_features // world_size"),
      ("full.weight.detach()[block].clone()",
       "full.weight.detach()[:, block].clone()")],
     "OUTPUT features"),
    ("fc2 split by output features",
     [("full.weight.detach()[:, block].clone()",
       "full.weight.detach()[block].clone()")],
     "INPUT features"),
    ("fc2's bias divided among ranks",
     [("nn.Parameter(full.bias.detach().clone())",
       "nn.Parameter(full.bias.detach().clone() / world_size)")],
     "fc2's bias is not split"),
    ("every rank takes the other rank's block",
     [("block = slice(rank * k, (rank + 1) * k)      # output features are its rows",
       "block = slice((world_size - 1 - rank) * k, (world_size - rank) * k)")],
     "That is rank 1's block"),
    ("f's backward never all-reduces", [(F_BACKWARD, "        return grad\n")],
     "only this rank's share: f's backward must all-reduce"),
    ("g's backward all-reduces again",
     [("        return grad              # d(sum of partials) / d(my partial) = 1\n",
       "        grad = grad.clone()\n        dist.all_reduce(grad)\n"
       "        return grad\n")],
     "2x too big"),
    ("f's forward all-reduces the input",
     [("    def forward(ctx, x):\n        return x\n",
       "    def forward(ctx, x):\n        x = x.clone()\n        dist.all_reduce(x)\n"
       "        return x\n")],
     "MLP of 2 x the input"),
])
def test_tp_mlp_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic from-scratch mistake get its own hint?"""
    path = write_program(folder, NOTEBOOK, "tp_mlp.py", replace)
    expect_hint(checks.tp_mlp, path, hint)


def test_tp_mlp_stub_is_not_done(folder):
    """Does the lab's stub read 'not done yet'?"""
    path = write_program(folder, NOTEBOOK, "tp_mlp.py", source_folder="labs")
    expect_hint(checks.tp_mlp, path, "not done yet")


# ---------------------------------------------------------------- section 3, 8.2


def test_parallelize_module_mlp_equals_unsplit(folder):
    """Does the notebook's parallelize_module demo equal the unsplit MLP to 1e-5?"""
    api_demo = load_program(folder / "api_demo.py")   # written by the fixture
    torch.manual_seed(0)
    mlp, x = tp.MLP(16, 64), torch.randn(8, 16)
    ranks = launch.run(api_demo.split_mlp, 2, args=(mlp.state_dict(), x),
                       backend="gloo", timeout=60)
    want = tp.unsplit(mlp, x)
    for got in ranks:
        assert (got["out"] - want["out"]).abs().max() < 1e-5
        assert (got["x_grad"] - want["x_grad"]).abs().max() < 1e-5
        for name, grad in want["grads"].items():
            assert (got["grads"][name] - grad).abs().max() < 1e-5, name


def test_parallelize_module_block_equals_unsplit(folder, capsys):
    """Does the solution's plan split tp.Block over 2 ranks without changing it?"""
    checks.tp_block(str(folder / "tp_block.py"))
    assert "✅ tp_block: passed" in capsys.readouterr().out


PLAN_Q = '"attn.q": ColwiseParallel(),    # q, k, v by output features: whole heads'


@pytest.mark.parametrize("mistake, replace, hint", [
    ("heads not divided",
     [("    block.attn.n_heads //= mesh.size()  # each rank now computes n_heads / N "
       "heads\n", "")], r"n_heads //= mesh.size\(\)"),
    ("q rowwise", [(PLAN_Q, '"attn.q": RowwiseParallel(),')],
     "attn.q must be ColwiseParallel"),
    ("out colwise",
     [('"attn.out": RowwiseParallel(),', '"attn.out": ColwiseParallel(),')],
     "attn.out must be RowwiseParallel"),
    ("v left out", [('        "attn.v": ColwiseParallel(),\n', "")],
     "attn.v not in the plan"),
    ("the attention container named",
     [(PLAN_Q, '"attn": ColwiseParallel(), ' + PLAN_Q)], "'attn' names no nn.Linear"),
    ("wrong input_layouts",
     [('"mlp.fc2": RowwiseParallel(),',
       '"mlp.fc2": RowwiseParallel(input_layouts=__import__("torch").distributed'
       '.tensor.Replicate()),')], "keep the default input_layouts"),
    ("use_local_output=False",
     [('"mlp.fc2": RowwiseParallel(),',
       '"mlp.fc2": RowwiseParallel(use_local_output=False),')],
     r"use_local_output=True"),
])
def test_tp_block_names_the_mistake(folder, mistake, replace, hint):
    """Does each wrong plan (or forgotten head count) get its own hint?"""
    path = write_program(folder, NOTEBOOK, "tp_block.py", replace)
    expect_hint(checks.tp_block, path, hint)


# ---------------------------------------------------------------- exercise 8.3


def _request(mistake=None):
    """The latency model, with one classic mistake."""
    def fn(layers, device, link, n, split):
        whole = layers.num_layers * latency_model.layer_seconds(layers, device, 1)
        hop = link.message_seconds(layers.activation_bytes)
        if split == "single" or n == 1:
            return whole * (2 if mistake == "n=1" else 1)
        if split == "layerwise":
            if mistake == "layerwise divided":
                return whole / n + n * hop
            return whole + (n - 1 if mistake == "n-1 hops" else n) * hop
        split_layer = latency_model.layer_seconds(
            layers, device, 1 if mistake == "not divided" else n)
        count = {"no all-reduce": 0,
                 "one all-reduce": 1}.get(mistake, layers.allreduces)
        per_layer = split_layer + count * link.allreduce_seconds(
            layers.activation_bytes, n)
        return (0 if mistake == "no request" else hop) + layers.num_layers * per_layer
    return fn


def test_request_seconds_passes_on_the_model(capsys):
    """Does the reference model pass its own check?"""
    checks.request_seconds(_request())
    assert "✅ request_seconds: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, hint", [
    ("layerwise divided", "does NOT divide the compute"),
    ("n-1 hops", "must come back to device 0"),
    ("no all-reduce", "Each layer ends with all-reduce"),
    ("one all-reduce", "Count the all-reduces per layer"),
    ("not divided", "Each device holds 1/n of every layer"),
    ("no request", "must first reach the other devices"),
    ("n=1", "On one device nothing is split"),
])
def test_request_seconds_names_the_mistake(mistake, hint):
    """Does each classic latency-model mistake get its own hint?"""
    with pytest.raises(ExerciseFailed, match=hint):
        checks.request_seconds(_request(mistake))


# ---------------------------------------------------------------- exercise 8.4


def test_dp_tp_equals_one_process(folder, capsys):
    """Do 4 ranks (2 replicas x 2-way TP) give one process's gradients?"""
    checks.dp_tp(str(folder / "dp_tp.py"))
    assert "✅ dp_tp: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("TP pairs across nodes",
     [("(world_size // tp_size, tp_size),\n                            "
       'mesh_dim_names=("dp", "tp"))',
       '(tp_size, world_size // tp_size), mesh_dim_names=("tp", "dp"))')],
     "ranks on different nodes"),
    ("batch split by TP rank",
     [('dp_rank, dp_size = mesh.get_local_rank("dp")',
       'dp_rank, dp_size = mesh.get_local_rank("tp")')], "the SAME samples"),
    ("whole batch everywhere",
     [("return x.chunk(dp_size)[dp_rank], y.chunk(dp_size)[dp_rank]", "return x, y")],
     "that is the whole batch"),
    ("sum, not mean", [("        local /= dp_size\n", "")], "That is the SUM"),
    ("never averaged",
     [("        dist.all_reduce(local, group=group)    # over the ranks with the "
       "same shard\n        local /= dp_size\n", "        pass\n")],
     "never averaged"),
    ("averaged over the TP group",
     [('group, dp_size = mesh.get_group("dp")',
       'group, dp_size = mesh.get_group("tp")')],
     "Average over the DP group"),
    ("a DTensor passed to all_reduce",
     [("        local = param.grad.to_local()", "        local = param.grad")],
     r"all-reduce param.grad.to_local\(\)"),
])
def test_dp_tp_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic 2-D mistake get its own hint?"""
    path = write_program(folder, NOTEBOOK, "dp_tp.py", replace)
    expect_hint(checks.dp_tp, path, hint)


# ---------------------------------------------------------------- labkit helpers


def test_latency_model_splits_agree_on_one_device():
    """On one device, are all three splits the plain compute?"""
    layers = latency_model.transformer(24, 2048)
    device = latency_model.DEVICES["A100 80GB"]
    link = latency_model.LINKS["NVLink 3 (DGX A100)"]
    times = {s: latency_model.request_seconds(layers, device, link, 1, s)
             for s in latency_model.SPLITS}
    assert len(set(times.values())) == 1
    assert math.isclose(layers.params, 12 * 24 * 2048**2)


def test_latency_model_refuses_bad_input():
    """Do an unknown split and a bad device count get a ValueError naming them?"""
    layers = latency_model.transformer(2, 64)
    device = latency_model.DEVICES["H200"]
    link = latency_model.LINKS["NVLink 4 (H100/H200)"]
    with pytest.raises(ValueError, match="'pipeline'"):
        latency_model.request_seconds(layers, device, link, 2, "pipeline")
    with pytest.raises(ValueError, match="got 0"):
        latency_model.request_seconds(layers, device, link, 0, "tensor")


def test_fit_link_recovers_alpha_and_beta():
    """Does the fit give back the alpha and beta that made the times?"""
    sizes = [4, 4096, 2**18, 2**22]
    link = latency_model.fit_link(sizes, [50e-6 + s / 2e9 for s in sizes], "made up")
    assert math.isclose(link.alpha_s, 50e-6, rel_tol=1e-6)
    assert math.isclose(link.bytes_per_s, 2e9, rel_tol=1e-6)
    with pytest.raises(ValueError, match="do not grow"):
        latency_model.fit_link(sizes, [1e-3, 1e-3, 1e-3, 1e-3], "flat")
    with pytest.raises(ValueError, match="two distinct sizes"):
        latency_model.fit_link([4], [1e-3], "one point")


def test_allreduce_model_is_ring():
    """Is an all-reduce alpha plus 2(n-1)/n of the bytes, and free on one device?"""
    link = latency_model.Link("test", 1e-5, 1e9)
    assert link.allreduce_seconds(1e9, 1) == 0
    assert math.isclose(link.allreduce_seconds(1e9, 4), 1e-5 + 1.5)
    assert math.isclose(link.message_seconds(1e9), 1e-5 + 1)


def test_check_divisible_names_the_numbers():
    """Is an uneven split refused with both numbers?"""
    tp.check_divisible(64, 4)
    with pytest.raises(ValueError, match="hidden = 10 does not split evenly .* = 4"):
        tp.check_divisible(10, 4, "hidden")


def test_mlp_blocks_reassemble_the_weights():
    """Do the ranks' blocks put back together give the whole weights?"""
    weights = {k: p.detach() for k, p in tp.MLP(8, 32).named_parameters()}
    blocks = [tp.mlp_blocks(weights, rank, 4) for rank in range(4)]
    assert torch.equal(torch.cat([b["fc1.weight"] for b in blocks]),
                       weights["fc1.weight"])
    assert torch.equal(torch.cat([b["fc2.weight"] for b in blocks], dim=1),
                       weights["fc2.weight"])
    assert all(torch.equal(b["fc2.bias"], weights["fc2.bias"]) for b in blocks)


def test_saved_activation_bytes_counts_activations_not_weights():
    """Does the count leave the weights out and see the activations?"""
    model = torch.nn.Linear(256, 256)
    x = torch.randn(4, 256, requires_grad=True)
    _, saved = tp.saved_activation_bytes(model, lambda: model(x))
    assert saved == x.numel() * 4          # Linear saves its input, and its weight


# ---------------------------------------------------------------- on 2 GPUs (NCCL)


@pytest.mark.gpu(2)
def test_tensor_parallel_on_nccl_equals_unsplit(folder):
    """On 2 GPUs over NCCL: exercise 8.1's Megatron MLP (its all-reduces inside
    autograd Functions, the backward's on autograd's thread) and the
    parallelize_module demo give the unsplit MLP's outputs and gradients?"""
    torch.manual_seed(0)
    mlp, x = tp.MLP(16, 64), torch.randn(8, 16)
    want = tp.unsplit(mlp, x)
    load_program(folder / "tp_mlp.py")
    ranks = launch.run(checks.run_learner, 2, args=("tp_mlp", mlp.state_dict(), x),
                       backend="nccl", timeout=60)
    for rank, got in enumerate(ranks):
        checks._check_mlp_rank("tp_mlp", rank, got, mlp, x, want, 2)
    api_demo = load_program(folder / "api_demo.py")
    ranks = launch.run(api_demo.split_mlp, 2, args=(mlp.state_dict(), x),
                       backend="nccl", timeout=60)
    for got in ranks:
        assert (got["out"] - want["out"]).abs().max() < 1e-5
        assert models.max_difference(want["grads"], got["grads"]) < 1e-5
