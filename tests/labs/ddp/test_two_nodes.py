"""Lab 03's two-node torchrun command, one per namespace node: the same weights as
a single-node run? Needs root (the ``can_cluster`` fixture says why it skips)."""

from notebook_cells import write_program

from labkit.labs.ddp import two_nodes

# ---------------------------------------------------------------- the course's commands

def test_lab03_two_node_torchrun_equals_the_single_node_run(can_cluster, tmp_path):
    """Lab 03's exact two-node command, one torchrun per node: the same weights?"""
    for module in ("ddp_worker.py", "ddp_script.py"):
        write_program(tmp_path, "03_ddp.ipynb", module)
    result = two_nodes.ddp_two_nodes(tmp_path / "ddp_script.py", epochs=1, limit=256,
                                     folder=tmp_path)
    assert result["command"] == (
        "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d "
        f"--rdzv-endpoint=node0:29400 --rdzv-id=job42 ddp_script.py "
        f"{tmp_path / 'two_node_weights.pt'} 1 256")
    saved = [o for o in result["outputs"].values() if "rank 0 of 2 (gloo" in o]
    assert len(saved) == 1, result["outputs"]
    assert result["equal"], f"max |diff| {result['max_diff']}"
