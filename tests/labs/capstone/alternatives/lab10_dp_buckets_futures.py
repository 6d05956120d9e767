"""Lab 10, exercise 10.2 in another idiom: torch's own flatten helpers, buckets as a
small dataclass, and each bucket's mean computed in a future's callback (DDP's comm
hooks style: get_future().then(...)), waited with torch.futures.wait_all."""
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass
class _Bucket:
    params: list
    pending: int = 0
    future: object = None
    seen: set = field(default_factory=set)


class Buckets:
    def __init__(self, params, group, bucket_bytes, accumulations=1):
        self.group, self.size = group, dist.get_world_size(group)
        self.accumulations = accumulations
        params = [p for p in params if p.requires_grad]
        self.buckets = []
        for param in reversed(params):
            if not self.buckets or sum(p.numel() * p.element_size()
                                       for p in self.buckets[-1].params) >= bucket_bytes:
                self.buckets.append(_Bucket([]))
            self.buckets[-1].params.append(param)
        self.where = {id(p): b for b in self.buckets for p in b.params}
        self._reset()
        for param in params:
            param.register_post_accumulate_grad_hook(self._hook)

    def _reset(self):
        for bucket in self.buckets:
            bucket.pending = len(bucket.params) * self.accumulations
            bucket.future = None

    def _hook(self, param):
        bucket = self.where[id(param)]
        bucket.pending -= 1
        if bucket.pending:
            return
        flat = _flatten_dense_tensors([p.grad for p in bucket.params])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        bucket.future = work.get_future().then(
            lambda fut, flat=flat: flat.div_(self.size))

    def wait(self):
        futures = [b.future for b in self.buckets if b.future is not None]
        torch.futures.wait_all(futures)
        for bucket in self.buckets:
            if bucket.future is None:
                continue
            means = _unflatten_dense_tensors(bucket.future.value(),
                                             [p.grad for p in bucket.params])
            for param, mean in zip(bucket.params, means):
                param.grad.copy_(mean)
        self._reset()
