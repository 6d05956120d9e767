"""Checks for lab 02 (data parallelism from scratch, then nn.DataParallel): scatter,
gradient averaging by chunk size, the ``module.`` prefix."""

import torch
from torch import nn

from labkit.checks._core import ExerciseFailed, attempt, passed

__all__ = ["scatter_batch", "average_gradients", "strip_module_prefix"]


def scatter_batch(fn) -> None:
    """Check ``fn(images, labels, num_replicas)`` splits a batch into aligned chunks."""
    name = "scatter_batch"
    labels = torch.arange(10)
    images = labels.float().view(10, 1).expand(10, 3).clone()
    for replicas, want in [(2, [5, 5]), (3, [4, 3, 3]), (4, [3, 3, 2, 2])]:
        chunks = list(attempt(name, fn, images, labels, replicas))
        sizes = [len(y) for _, y in chunks]
        if sizes != want:
            raise ExerciseFailed(
                f"{name}: 10 samples over {replicas} replicas should give sizes {want} "
                f"(as equal as possible, larger first), got {sizes}. Try "
                "images.tensor_split(num_replicas)."
            )
        if any(not torch.equal(x[:, 0].long(), y) for x, y in chunks):
            raise ExerciseFailed(
                f"{name}: images and labels of a chunk do not match: "
                "split both the same way."
            )
        if torch.cat([y for _, y in chunks]).tolist() != list(range(10)):
            raise ExerciseFailed(
                f"{name}: the chunks, put back together, must be the "
                "batch in its original order (no shuffling, no loss)."
            )
    try:
        fn(images[:2], labels[:2], 3)
    except ValueError:
        pass
    else:
        raise ExerciseFailed(
            f"{name}: a batch of 2 over 3 replicas leaves a replica "
            "with nothing: raise ValueError saying so."
        )
    passed(name, "Same split as tensor_split, and a clear error for too small a batch.")


def _replica_grads():
    """Return per-replica gradients of the chunk-mean loss, chunk sizes, full grads."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    images, labels = torch.randn(7, 3), torch.tensor([0, 1, 1, 0, 1, 0, 0])
    loss_fn = nn.CrossEntropyLoss()
    sizes, grads = [4, 3], []
    for x, y in zip(images.split(sizes), labels.split(sizes)):
        grads.append(
            torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
        )
    full = torch.autograd.grad(loss_fn(model(images), labels), list(model.parameters()))
    return [list(g) for g in grads], sizes, list(full)


def average_gradients(fn) -> None:
    """Check ``fn(replica_grads, chunk_sizes)`` weights each replica by its chunk."""
    name = "average_gradients"
    grads, sizes, full = _replica_grads()
    got = attempt(name, fn, grads, sizes)
    if not isinstance(got, (list, tuple)) or len(got) != len(full):
        raise ExerciseFailed(
            f"{name}: return one tensor per parameter ({len(full)}), "
            f"got {type(got).__name__}."
        )
    if all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, full)):
        passed(name, "Weighted by chunk size, the average is the full-batch gradient.")
        return
    plain = [sum(g[i] for g in grads) / len(grads) for i in range(len(full))]
    summed = [sum(g[i] for g in grads) for i in range(len(full))]
    if all(torch.allclose(g, p, atol=1e-6) for g, p in zip(got, plain)):
        hint = (
            "That is the plain mean of the replicas: with chunks of 4 and 3 a "
            "sample in the small chunk counts more. Weight replica i by n_i / N."
        )
    elif all(torch.allclose(g, s, atol=1e-6) for g, s in zip(got, summed)):
        hint = "That is the sum: weight replica i by n_i / N (the weights add up to 1)."
    else:
        hint = "Parameter i's gradient is sum over replicas of n_r / N * grads[r][i]."
    raise ExerciseFailed(
        f"{name}: the result differs from the full-batch gradient. {hint}"
    )


def strip_module_prefix(fn) -> None:
    """Check ``fn(state_dict)`` drops the leading ``module.`` and nothing else."""
    name = "strip_module_prefix"
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("module", nn.Linear(2, 1))  # a layer really called "module"
    wrapped = nn.DataParallel(model)
    got = attempt(name, fn, wrapped.state_dict())
    want = model.state_dict()
    if not isinstance(got, dict) or list(got) != list(want):
        hint = (
            "Remove only a LEADING 'module.': key[len('module.'):] when "
            "key.startswith('module.'). str.replace also hits a layer named "
            "'module' inside the model."
        )
        raise ExerciseFailed(
            f"{name}: expected keys {list(want)}, got "
            f"{list(got) if isinstance(got, dict) else got!r}. {hint}"
        )
    fresh = nn.Sequential(nn.Linear(2, 2))
    fresh.add_module("module", nn.Linear(2, 1))
    fresh.load_state_dict(got)
    if any(not torch.equal(got[k], want[k]) for k in want):
        raise ExerciseFailed(
            f"{name}: keep every tensor as it is; only rename the keys."
        )
    passed(name, "The checkpoint now loads into the plain model (strict=True).")
