"""Model- and pipeline-parallel workers, one rank per device, started by ``launch.run``.

Taught in: lab 04 (模型并行 model parallelism: a model split over two ranks,
activations sent at the boundary) and lab 05 (流水线并行: GPipe and 1F1B over
ranks, then ``torch.distributed.pipelining``). Every rank builds the same model from the
same seed and keeps its own stage; workers return dicts, the notebook prints.
Point-to-point ``send``/``recv`` work on gloo (CPU) and NCCL (GPU) alike.
"""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit import data, models, pipeline, timeline, train
from labkit.pipeline_run import StageRunner, split_stages

__all__ = ["CONFIG", "reference", "model_parallel",
           "pipeline_parallel"]

CONFIG = {"num_layers": 8, "width": 256, "batch": 64, "seed": 0, "steps": 3,
          "requests": 20, "num_microbatches": 4, "microbatch_counts": (1, 2, 4, 8)}


def _model(cfg: dict):
    torch.manual_seed(cfg["seed"])
    return models.deep_mlp(cfg["num_layers"], cfg["width"])


def _batch(cfg: dict, device):
    return data.random_batch(cfg["batch"], cfg["seed"] + 1, device)


def reference(cfg: dict = CONFIG) -> dict:
    """Return the unsplit model's logits, loss and gradients on the full batch."""
    model = _model(cfg)
    images, labels = _batch(cfg, "cpu")
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": loss.item(), "grads": grads}


def _my_stage(ctx, cfg: dict):
    return split_stages(_model(cfg), ctx.world_size)[ctx.rank].to(ctx.device)


def _grads(module) -> dict:
    return {name: p.grad.detach().cpu().clone()
            for name, p in module.named_parameters()}


def _input_width(stage) -> int:
    """Return the width a stage expects as input (its first Linear's in_features)."""
    return stage[0].in_features


def _recv(shape, src: int, device) -> torch.Tensor:
    buffer = torch.empty(shape, device=device)
    dist.recv(buffer, src=src)   # blocks: this is idle time, outside the timeline
    return buffer


def _split_step(ctx, stage, images, labels, recorder, step: int):
    """Train forward and backward through the chain of ranks; return the last output."""
    first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
    inputs = images if first else _recv((len(images), _input_width(stage)),
                                        ctx.rank - 1, ctx.device)
    inputs.requires_grad_(not first)
    with recorder.record("F", step):
        out = stage(inputs)
        loss = F.cross_entropy(out, labels) if last else None
    if not last:
        dist.send(out.detach(), dst=ctx.rank + 1)   # activations cross the boundary
    grad = None if last else _recv(out.shape, ctx.rank + 1, ctx.device)
    with recorder.record("B", step):
        (loss if last else out).backward(grad)
    if not first:
        dist.send(inputs.grad, dst=ctx.rank - 1)    # and their gradients come back
    return (out.detach().cpu(), loss.item()) if last else (None, None)


@torch.no_grad()
def _serve(ctx, stage, cfg: dict) -> list[float]:
    """Answer single-image requests through the chain; rank 0 times each, in ms."""
    first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
    width, latencies = cfg["width"], []
    for i in range(cfg["requests"]):
        start = time.perf_counter()
        x = torch.randn(1, 1, 28, 28, device=ctx.device) if first else \
            _recv((1, width), ctx.rank - 1, ctx.device)
        out = stage(x)
        if not last:
            dist.send(out, dst=ctx.rank + 1)
        elif not first:
            dist.send(out, dst=0)   # the answer goes back to the rank that was asked
        if first and not last:
            _recv((1, 10), ctx.world_size - 1, ctx.device)   # the answer comes back
        train.synchronize(ctx.device)
        latencies.append((time.perf_counter() - start) * 1e3)
    return latencies if first else []


def model_parallel(ctx, cfg: dict = CONFIG) -> dict:
    """Lab 04: train steps on a model split over the ranks, then serve requests.

    Returns this rank's gradients (first step), the output and loss (last rank),
    the timeline events and, on rank 0, per-request latencies in ms.
    """
    stage = _my_stage(ctx, cfg)
    images, labels = _batch(cfg, ctx.device)
    recorder = timeline.Recorder(ctx.rank, ctx.device)
    result = {"rank": ctx.rank, "device": str(ctx.device)}
    _split_step(ctx, stage, images, labels, timeline.Recorder(), -1)   # warm-up
    for step in range(cfg["steps"]):
        stage.zero_grad()
        logits, loss = _split_step(ctx, stage, images, labels, recorder, step)
        if step == 0:
            result.update(grads=_grads(stage), logits=logits, loss=loss)
    result["events"] = recorder.events()
    result["latency_ms"] = _serve(ctx, stage, cfg)
    return result


def _scratch_step(ctx, stage, cfg: dict, name: str, num_microbatches: int):
    """Run one step of ``name`` from scratch over the ranks; return events and peak."""
    images, labels = _batch(cfg, ctx.device)
    microbatches = pipeline.split_microbatches(images, labels, num_microbatches)
    last_stage = ctx.world_size - 1
    runner = StageRunner({ctx.rank: stage}, microbatches, last_stage, F.cross_entropy)
    recorder, sends = timeline.Recorder(ctx.rank, ctx.device), []
    shape = (len(microbatches[0][0]), cfg["width"])   # every boundary: (mb, width)
    for action in pipeline.orders(name, ctx.world_size, num_microbatches)[ctx.rank]:
        forward = action.kind == "F"
        src = ctx.rank - 1 if forward else ctx.rank + 1
        received = _recv(shape, src, ctx.device) if 0 <= src <= last_stage else None
        with recorder.record(action.kind, action.microbatch):
            step = runner.forward if forward else runner.backward
            sent = step(action, received)
        if sent is not None:   # isend: never block, or 1F1B's crossing sends deadlock
            dst = ctx.rank + 1 if forward else ctx.rank - 1
            sends.append((dist.isend(sent.contiguous(), dst=dst), sent))
    for work, _ in sends:
        work.wait()
    return recorder.events(), runner.peak_held


def _torch_schedule(ctx, cfg: dict, schedule_name: str, traced: bool = False) -> dict:
    """Run one step with ``torch.distributed.pipelining``; return this stage's grads."""
    from torch.distributed import pipelining as pp

    num_microbatches = cfg["num_microbatches"]
    pipeline.check_microbatches(cfg["batch"], num_microbatches, ctx.world_size)
    images, labels = _batch(cfg, ctx.device)
    if traced:   # the tracer front end: cut where our own split cuts, by name
        model = _model(cfg).to(ctx.device)
        cuts = [len(s) for s in split_stages(_model(cfg), ctx.world_size)]
        spec = {str(sum(cuts[:i])): pp.SplitPoint.BEGINNING
                for i in range(1, ctx.world_size)}
        pipe = pp.pipeline(model, mb_args=(images.chunk(num_microbatches)[0],),
                           split_spec=spec)
        stage = pipe.build_stage(ctx.rank, ctx.device)
    else:
        module = _my_stage(ctx, cfg)
        stage = pp.PipelineStage(module, ctx.rank, ctx.world_size, ctx.device)
    schedule_class = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[schedule_name]
    schedule = schedule_class(stage, n_microbatches=num_microbatches,
                              loss_fn=F.cross_entropy)
    losses: list = []
    if ctx.rank == 0:
        schedule.step(images)
    elif ctx.rank == ctx.world_size - 1:
        schedule.step(target=labels, losses=losses)
    else:
        schedule.step()
    return {"grads": _grads(stage.submod),
            "loss": torch.stack(losses).mean().item() if losses else None}


def pipeline_parallel(ctx, cfg: dict = CONFIG) -> dict:
    """Lab 05: GPipe and 1F1B from scratch over the ranks, then PyTorch's schedules.

    Returns, per schedule: grads (at ``num_microbatches``), events and peak
    micro-batches held for each count in ``microbatch_counts``; then the grads of
    ``ScheduleGPipe``, ``Schedule1F1B`` and the traced ``pipeline(...)`` split.
    """
    result: dict = {"rank": ctx.rank, "scratch": {}, "torch": {}}
    warm_up = _my_stage(ctx, cfg)   # first calls allocate: keep them off the timelines
    _scratch_step(ctx, warm_up, cfg, "gpipe", cfg["num_microbatches"])
    for name in ("gpipe", "1f1b"):
        runs = {}
        for m in cfg["microbatch_counts"]:
            stage = _my_stage(ctx, cfg)
            events, peak = _scratch_step(ctx, stage, cfg, name, m)
            runs[m] = {"events": events, "peak_held": peak, "grads": _grads(stage)}
        result["scratch"][name] = runs
    for key, name, traced in [("ScheduleGPipe", "gpipe", False),
                              ("Schedule1F1B", "1f1b", False),
                              ("pipeline(...) + ScheduleGPipe", "gpipe", True)]:
        result["torch"][key] = _torch_schedule(ctx, cfg, name, traced)
    return result
