"""Lab 10, exercise 10.1, another idiom: torch's own tensor parallelism (DTensor).

``parallelize_module`` on a DeviceMesh made from the TP group: q, k, v and fc1
column-parallel (each rank keeps whole heads), out and fc2 row-parallel (their
partial sums all-reduced, the bias added once). gpt.Attention reshapes q into
(B, T, -1, head_dim), so with 1/tp of q's features it computes num_heads / tp heads
unchanged. The parameters become DTensors; their local shards are what a rank holds.
"""
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)


def parallelize_block(block, group):
    """Split ``block`` (a gpt.Block) over the TP ``group``, in place."""
    device = next(block.parameters()).device.type
    mesh = DeviceMesh.from_group(group, device)
    parallelize_module(block, mesh, {
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(), "attn.out": RowwiseParallel(),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(),
    })
