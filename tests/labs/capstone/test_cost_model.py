"""Lab 10's theory: each rank's parameters, bytes, activations and messages follow from
the layout, and agree with what a run measures."""

import pytest
import torch

from labkit import launch, timeline
from labkit.labs.capstone import cost_model, gpt, harness, layout, measure
from notebook_cells import solution_folder

TINY = gpt.GPTConfig(context=16, width=32, num_layers=2, num_heads=4)
MESH = layout.RunConfig(model=TINY, dp=2, tp=2, pp=2, optimizer="adamw", lr=1e-3,
                        bucket_bytes=2**13)


@pytest.mark.parametrize("cfg", layout.layouts(MESH), ids=lambda c: c.name)
def test_parameters_per_rank_are_the_shards(cfg):
    """Does the formula count exactly the tensors layout.shard gives each rank?"""
    whole = {n: p.detach() for n, p in gpt.build(TINY).named_parameters()}
    for rank in range(cfg.world_size):
        held = sum(t.numel() for t in layout.shard(whole, cfg, rank).values())
        assert cost_model.params_per_rank(cfg, rank) == held, (cfg.name, rank)


def test_state_bytes_are_lab07s_model():
    """fp32 parameters and gradients, 1 state (SGD momentum) or 2 (AdamW)?"""
    params = cost_model.params_per_rank(MESH, 0)
    assert cost_model.state_bytes(MESH, 0) == {"parameters": 4 * params,
                                               "gradients": 4 * params,
                                               "optimizer states": 8 * params}


def test_activation_count_matches_what_autograd_saves_in_one_process():
    """For one process, is the per-token count within a scalar of what a step saves?"""
    cfg = layout.RunConfig(model=TINY, dp=1, tp=1, pp=1, num_microbatches=1)
    model = gpt.build(TINY)
    tokens = torch.randint(0, 256, (4, TINY.context + 1))
    with timeline.Watch(model) as watch:
        loss = gpt.loss_of(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    assert abs(watch.peak_bytes - cost_model.activation_bytes(cfg, 0, 4)) <= 8


def test_a_mesh_run_measures_what_the_theory_says(tmp_path, monkeypatch):
    """On 8 ranks, do bytes held, activations and messages per dimension equal the
    theory for every rank?"""
    from labkit.labs.capstone import checks

    solution_folder(tmp_path, monkeypatch, "10_capstone.ipynb",
                    ("tp_gpt.py", "dp_buckets.py", "pp_gpt.py", "gpt3d.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    batches = checks.check_batches(steps=2)
    options = harness.Options(snapshots=False, lazy=False, bound_s=None, p2p=True,
                              memory=True)
    ranks = launch.run(harness.run_trainer, 8, args=("gpt3d", MESH, batches, options),
                       timeout=60)
    for rank, got in enumerate(ranks):
        want = cost_model.state_bytes(MESH, rank)
        assert {k: got["memory"][k] for k in want} == want, rank
        activations = cost_model.activation_bytes(MESH, rank, len(batches[0]))
        assert abs(got["memory"]["activations"] - activations) <= 8, rank
        counted = measure.traffic(MESH, rank, got["comm"], got["messages"], steps=2)
        for dim, (n, nbytes, sent, sent_bytes) in cost_model.messages(
                MESH, rank, len(batches[0])).items():
            assert counted[dim]["all_reduce_bytes"] == pytest.approx(nbytes), (rank, dim)
            assert counted[dim]["messages"] == sent, (rank, dim)
            assert counted[dim]["message_bytes"] == sent_bytes, (rank, dim)
            if dim != "dp":   # DP's count depends on how the buckets close
                assert counted[dim]["all_reduces"] == n, (rank, dim)


def test_the_prediction_adds_up_and_grows_with_the_bubble():
    """Does the predicted step equal its parts, and does a deeper pipeline cost more
    bubble for the same m?"""
    parts = cost_model.predict_step(MESH, 8)
    assert parts["total"] == pytest.approx(parts["compute"] + parts["tp"] + parts["pp"]
                                           + parts["dp"])
    flat = cost_model.predict_step(layout.RunConfig(model=TINY, dp=2, tp=2, pp=1), 8)
    assert flat["bubble"] == 0 < parts["bubble"]
