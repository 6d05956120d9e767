"""Lab 10's layout: which rank holds which shard, the same as DeviceMesh lays it out."""

import pytest
import torch

from labkit import launch
from labkit.labs.capstone import gpt, layout

TINY = gpt.GPTConfig(context=16, width=32, num_layers=2, num_heads=4)
MESH = layout.RunConfig(model=TINY, dp=2, tp=2, pp=2)


def test_coords_and_ranks_are_inverse():
    """Does rank_of(coords(r)) == r for every rank, the last dimension fastest?"""
    assert [layout.rank_of(MESH, layout.coords(MESH, r)) for r in range(8)] == list(
        range(8))
    assert layout.coords(MESH, 5) == layout.Coords(pp=1, dp=0, tp=1)
    with pytest.raises(ValueError, match="rank 8 is not on a mesh of 8"):
        layout.coords(MESH, 8)


def test_groups_are_the_documented_pairs():
    """Are TP pairs neighbours, DP pairs 2 apart, pipeline pairs 4 apart?"""
    assert [layout.group_ranks(MESH, r, "tp") for r in (0, 6)] == [[0, 1], [6, 7]]
    assert [layout.group_ranks(MESH, r, "dp") for r in (1, 4)] == [[1, 3], [4, 6]]
    assert layout.group_ranks(MESH, 3, "pp") == [3, 7]


def mesh_coordinates(ctx):
    """Rank worker: where init_device_mesh puts this rank on a (2, 2, 2) mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    return tuple(mesh.get_local_rank(dim) for dim in ("pp", "dp", "tp"))


def test_coords_are_where_init_device_mesh_puts_each_rank():
    """Does layout.coords agree with init_device_mesh((pp, dp, tp)) on 8 ranks?"""
    found = launch.run(mesh_coordinates, 8, timeout=60)
    assert found == [tuple(layout.coords(MESH, r).__dict__.values()) for r in range(8)]


def test_shards_reassemble_into_the_whole_model():
    """Do every rank's shards put together give back the whole GPT's tensors?"""
    whole = {n: p.detach() for n, p in gpt.build(TINY).named_parameters()}
    for cfg in layout.layouts(MESH):
        shards = [layout.shard(whole, cfg, r) for r in range(cfg.world_size)]
        back = layout.assemble(shards, cfg)
        assert back.keys() == whole.keys(), cfg.name
        assert all(torch.equal(back[n], whole[n]) for n in whole), cfg.name


def test_a_shard_holds_its_stage_and_its_heads():
    """Does rank 5 (pp 1, tp 1) hold block 1's second half of q rows, out's columns,
    ln_f and wte, but not wpe or block 0?"""
    whole = {n: p.detach() for n, p in gpt.build(TINY).named_parameters()}
    mine = layout.shard(whole, MESH, 5)
    assert "wpe.weight" not in mine and "ln_f.weight" in mine and "wte.weight" in mine
    assert not any(name.startswith("blocks.0.") for name in mine)
    assert torch.equal(mine["blocks.1.attn.q.weight"], whole["blocks.1.attn.q.weight"][16:])
    assert torch.equal(mine["blocks.1.attn.out.weight"],
                       whole["blocks.1.attn.out.weight"][:, 16:])
    assert torch.equal(mine["blocks.1.attn.out.bias"], whole["blocks.1.attn.out.bias"])


def test_canonical_names_accept_wrappers_and_inner_linears():
    """Are 'blocks.1.attn.q.linear.weight' and 'module.wte.weight' read as the GPT's?"""
    known = [n for n, _p in gpt.GPT(TINY).named_parameters()]
    got = layout.canonical({"blocks.1.attn.q.linear.weight": 1, "module.wte.weight": 2,
                            "blocks.1.attn.q.weight": 3, "other.thing": 4}, known)
    assert got == {"blocks.1.attn.q.weight": 3, "wte.weight": 2, "other.thing": 4} or (
        got["wte.weight"] == 2 and got["other.thing"] == 4)


def test_layouts_switch_every_subset_of_dimensions_off():
    """Are there 2**3 layouts, from one process to the whole mesh?"""
    found = [(c.dp, c.tp, c.pp) for c in layout.layouts(MESH)]
    assert len(set(found)) == 8 and found[0] == (1, 1, 1) and found[-1] == (2, 2, 2)
