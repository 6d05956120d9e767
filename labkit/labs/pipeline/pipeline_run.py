"""Run a pipeline schedule for real: stages, micro-batches, gradient accumulation.

Taught in: lab 05 (GPipe from scratch, then 1F1B). Every executor walks the per-rank
orders of ``pipeline.orders``, so the table you print is the order that runs.
``run_in_order`` runs in one process, step by step (correct, no overlap);
``run_on_threads`` gives each rank a thread and a fixed cost per action spent
*waiting* (``time.sleep`` releases the GIL): on 2 CPU cores that is the only honest
way to let 4 "devices" overlap, so it measures the schedule, not the arithmetic.
The widget that explores schedules is ``explorer.pipeline_schedules``; the sweep
against the formula is ``labkit bench pipeline``.
"""

import queue
import threading
import time

import torch.nn.functional as F

from labkit import pipeline, timeline
from labkit.messages import _

__all__ = ["StageRunner", "run_in_order", "run_on_threads"]


class StageRunner:
    """One rank's share of a pipeline: its stage modules and its saved activations."""

    def __init__(self, modules: dict, microbatches, last_stage: int, loss_fn):
        self.modules, self.microbatches = modules, microbatches
        self.last_stage, self.loss_fn = last_stage, loss_fn
        self.saved: dict = {}
        self.losses: dict = {}
        self.peak_held = 0   # most micro-batches whose activations were kept at once

    def forward(self, action, received):
        """Run a stage forward; return the activation to send on (None on the last)."""
        x, y = self.microbatches[action.microbatch]
        if action.stage > 0:
            x = received.detach().requires_grad_(True)
        out = self.modules[action.stage](x)
        if action.stage == self.last_stage:   # mean loss of the batch = mean over mbs
            out = self.loss_fn(out, y) / len(self.microbatches)
            self.losses[action.microbatch] = out.item() * len(self.microbatches)
        self.saved[(action.stage, action.microbatch)] = (x, out)
        self.peak_held = max(self.peak_held, len(self.saved))
        return None if action.stage == self.last_stage else out.detach()

    def backward(self, action, received):
        """Run a stage backward (grads accumulate in .grad); return the input grad."""
        x, out = self.saved.pop((action.stage, action.microbatch))
        out.backward(None if action.stage == self.last_stage else received)
        return x.grad if action.stage > 0 else None


def _setup(stages, inputs, targets, num_microbatches, num_ranks, loss_fn):
    microbatches = pipeline.split_microbatches(inputs, targets, num_microbatches)
    last = len(stages) - 1
    return [StageRunner({s: stages[s] for s in range(r, len(stages), num_ranks)},
                        microbatches, last, loss_fn) for r in range(num_ranks)]


def _num_ranks(stages, num_chunks: int) -> int:
    if num_chunks < 1 or len(stages) % num_chunks:
        raise ValueError(_("{stages} stages do not split into {num_chunks} chunks per "
                           "rank: pass len(stages) = ranks x num_chunks.").format(
                               stages=len(stages), num_chunks=num_chunks))
    return len(stages) // num_chunks


def run_in_order(stages, inputs, targets, num_microbatches: int, name: str = "gpipe",
                 loss_fn=F.cross_entropy, recorder=None, num_chunks: int = 1) -> float:
    """Run one training step of schedule ``name`` in this process; return the loss.

    Gradients accumulate in the stages' ``.grad`` (call ``zero_grad`` first). The
    table's steps are walked in order, so every input is ready when it is used.
    Rank r holds stages r, r + ranks, ... (``num_chunks`` of them when interleaved).
    """
    num_ranks = _num_ranks(stages, num_chunks)
    table = pipeline.schedule(name, num_ranks, num_microbatches, num_chunks)
    workers = _setup(stages, inputs, targets, num_microbatches, num_ranks, loss_fn)
    mail: dict = {}
    recorder = recorder or timeline.Recorder()
    for step in range(len(table[0])):
        for rank, row in enumerate(table):
            action = row[step]
            if action is None:
                continue
            key = (action.kind, action.stage, action.microbatch)
            with recorder.record(action.kind, action.microbatch, row=rank):
                if action.kind == "F":
                    sent = workers[rank].forward(action, mail.pop(key, None))
                    mail[("F", action.stage + 1, action.microbatch)] = sent
                else:
                    sent = workers[rank].backward(action, mail.pop(key, None))
                    mail[("B", action.stage - 1, action.microbatch)] = sent
    return sum(workers[-1].losses.values()) / num_microbatches


class _Stopped(Exception):
    """Another rank failed: stop waiting for a message that will never come."""


def _receive(box: queue.Queue, errors: list, timeout_s: float = 60.0):
    """Wait for the next message, giving up when another rank has failed."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        try:
            return box.get(timeout=0.05)
        except queue.Empty:
            if errors:
                raise _Stopped() from None
    raise TimeoutError(_("no message after {seconds:.0f} s: the pipeline is "
                         "stuck").format(seconds=timeout_s))


def _thread_main(worker, order, boxes, rank, cost_s, recorder, errors):
    """Walk one rank's order: receive (idle), then compute and wait ``cost_s``, send."""
    try:
        for action in order:
            kind, stage, mb = action.kind, action.stage, action.microbatch
            first, last = stage == 0, stage == worker.last_stage
            needs_input = not first if kind == "F" else not last
            received = _receive(boxes[(kind, stage)], errors) if needs_input else None
            with recorder.record(kind, mb, row=rank):
                if kind == "F":
                    sent, target = worker.forward(action, received), ("F", stage + 1)
                else:
                    sent, target = worker.backward(action, received), ("B", stage - 1)
                time.sleep(cost_s)   # the stage's fixed cost, spent waiting (GIL free)
            if sent is not None:
                boxes[target].put(sent)
    except _Stopped:
        pass
    except Exception as err:   # surfaced by run_on_threads, naming the rank
        errors.append((rank, err))


def run_on_threads(stages, inputs, targets, num_microbatches: int, name: str = "gpipe",
                   cost_s: float = 0.01, loss_fn=F.cross_entropy, num_chunks: int = 1):
    """Run one step of ``name`` with one thread per rank; return (loss, events).

    Each forward and backward also waits ``cost_s`` seconds: equal, known stage costs.
    Recording happens outside the receive wait, so idle time is the bubble.
    """
    num_ranks = _num_ranks(stages, num_chunks)
    rank_orders = pipeline.orders(name, num_ranks, num_microbatches, num_chunks)
    workers = _setup(stages, inputs, targets, num_microbatches, num_ranks, loss_fn)
    boxes = {(kind, s): queue.Queue() for kind in "FB"
             for s in range(-1, len(stages) + 1)}
    recorder, errors = timeline.Recorder(), []
    threads = [threading.Thread(target=_thread_main, daemon=True,
                                args=(workers[r], rank_orders[r], boxes, r, cost_s,
                                      recorder, errors)) for r in range(num_ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        rank, err = errors[0]
        raise RuntimeError(_("pipeline rank {rank} failed: {err!r}").format(
            rank=rank, err=err)) from err
    return sum(workers[-1].losses.values()) / num_microbatches, recorder.events()
