"""Lab 09's node that fails for real: killed or cut off mid-training, the survivors
resume from their snapshot and the node rejoins. Needs root."""

import re

import torch

from labkit.labs.fault_tolerance import node_faults

# ---------------------------------------------------------------- lab 09: a node fails

def test_killed_node_survivors_resume_from_the_snapshot_and_it_rejoins(can_cluster,
                                                                       tmp_path):
    """Kill every process in node1 mid-training: node0 errs at once, resumes alone
    from its snapshot under --nnodes=1:2 --max-restarts; node1 restarted rejoins."""
    report = node_faults.node_failure("kill", rejoin=True, steps=24, step_s=0.1,
                                    folder=tmp_path / "run", timeout=10)
    print(report.summary())
    assert report.error_s is not None and report.error_s < 10, report.logs
    assert re.search(r"Connection (reset|closed) by peer", report.error_line)
    assert report.survivor_world == 1
    assert report.resumed_step == report.snapshot_step
    assert report.recovery_s is not None
    assert report.rejoin_world == 2 and report.rejoin_s is not None
    assert report.returncodes == {"node0": 0, "node1": 0}, report.logs
    assert report.final_step == 24
    assert report.max_diff < 1e-4   # 2 ranks, 1 rank, 2 ranks = one process


def test_link_down_survivors_get_a_timeout_error(can_cluster, tmp_path):
    """Pull node1's cable mid-training: node0's collective times out after 10 s."""
    report = node_faults.node_failure("link", resume=False, steps=16, step_s=0.1,
                                    folder=tmp_path / "run", timeout=10)
    print(report.summary())
    assert report.error_s is not None and 8 < report.error_s < 10 + 15, report.logs
    assert "Timed out waiting 10000ms" in report.error_line


def test_reference_weights_are_what_one_process_trains():
    """The no-failure reference is deterministic (the comparison's other side)."""
    one, two = node_faults.reference_weights(8), node_faults.reference_weights(8)
    assert all(torch.equal(one[k], two[k]) for k in one)
