"""Lab 02, exercise 2.1, another idiom: a reader of the concurrent.futures docs.
A ThreadPoolExecutor with one worker per replica, futures read in submission order,
the first failure re-raised as "Replica i failed" (capital R) after the pool has
shut down (leaving the ``with`` block waits for every thread).
"""
from concurrent.futures import ThreadPoolExecutor

import torch


def parallel_apply(fns, args):
    if len(fns) != len(args):
        raise ValueError("one tuple of arguments per function")
    grad_enabled = torch.is_grad_enabled()

    def run(fn, fn_args):
        with torch.set_grad_enabled(grad_enabled):
            return fn(*fn_args)

    with ThreadPoolExecutor(max_workers=max(1, len(fns))) as pool:
        futures = [pool.submit(run, fn, fn_args) for fn, fn_args in zip(fns, args)]
    results = []
    for i, future in enumerate(futures):
        error = future.exception()
        if error is not None:
            raise RuntimeError(f"Replica {i} failed: {error!r}") from error
        results.append(future.result())
    return results
