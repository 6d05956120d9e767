"""Lab 02, exercise 2.1, another idiom: PyTorch's own parallel_apply
(torch/nn/parallel/parallel_apply.py). A lock and a dict of results keyed by index,
``ExceptionWrapper`` around a failure, ``reraise()`` in the caller: it raises the
replica's own exception type with "Caught ValueError in replica 1 ..." and the
original traceback in the message.
"""
import threading

import torch
from torch._utils import ExceptionWrapper


def parallel_apply(fns, args):
    assert len(fns) == len(args)
    lock = threading.Lock()
    results = {}
    grad_enabled = torch.is_grad_enabled()

    def _worker(i, fn, fn_args):
        torch.set_grad_enabled(grad_enabled)
        try:
            output = fn(*fn_args)
            with lock:
                results[i] = output
        except Exception:
            with lock:
                results[i] = ExceptionWrapper(where=f"in replica {i}")

    threads = [threading.Thread(target=_worker, args=(i, fn, fn_args))
               for i, (fn, fn_args) in enumerate(zip(fns, args))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outputs = []
    for i in range(len(fns)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs
