"""Lab 06, exercise 6.2, another correct idiom: the shape of PyTorch's own
``fp16_compress_hook`` (cast, then divide in place; the world size from the default
group; decompress in one lambda: ``copy_`` returns the buffer)."""
import torch.distributed as dist


def cast_hook(state, bucket):
    group = dist.group.WORLD
    tensor = bucket.buffer()
    compressed = tensor.to(state).div_(group.size())
    work = dist.all_reduce(compressed, group=group, async_op=True)
    return work.get_future().then(lambda fut: tensor.copy_(fut.value()[0]))
