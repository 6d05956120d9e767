"""Lab 06, exercise 6.2, another correct idiom: the collective imported by name from
``distributed_c10d``, a decompress function that reads the future's tensor list."""
import torch
from torch.distributed.distributed_c10d import all_reduce, get_world_size


def cast_hook(dtype: torch.dtype, bucket) -> torch.futures.Future:
    grads = bucket.buffer()
    half = grads.div(get_world_size()).to(dtype)
    future = all_reduce(half, async_op=True).get_future()

    def back_to_fp32(fut: torch.futures.Future) -> torch.Tensor:
        (summed,) = fut.wait()
        grads.copy_(summed.to(grads.dtype))
        return grads

    return future.then(back_to_fp32)
