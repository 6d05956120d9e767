"""One solution per exercise that runs but computes the wrong thing.

Each is the exercise's solved code (its reference) with one classic mistake, most of
them the ones its lab's tests prove the check names (tests/labs/<room>/). Every
mistake here runs to its end on CPU ranks without hanging, so that a check judges its
result; ``wrong_source`` applies one and insists that it applies exactly once.
"""

MISTAKES = {   # reference key -> [(text of the solution, the mistake)]
    # lab 00
    "count_parameters": [(" if p.requires_grad)", ")")],          # frozen ones too
    "training_memory_bytes": [("copies = 4", "copies = 2")],      # no Adam states
    "allreduce_seconds": [("sent = 2 * (world_size - 1) / world_size * gradient_bytes",
                           "sent = gradient_bytes")],            # the ring's factor
    # lab 01
    "choose_device": [("torch.cuda.is_available()", "torch.cuda.is_available")],
    "mnist_transform": [("Normalize((data.MEAN,), (data.STD,))",
                         "Normalize((0.5,), (0.5,))")],
    "train_step": [("    optimizer.zero_grad()\n", "")],
    "iterate_minibatches": [("torch.randperm(len(labels), generator=generator)",
                             "torch.arange(len(labels))")],      # never shuffled
    # lab 02
    "parallel_apply.py": [("results[i] = fns[i](*args[i])",
                           "results[len(fns) - 1 - i] = fns[i](*args[i])")],
    "dp_step.py": [("return sum(n / sum(sizes) * loss.item() for n, loss in zip(sizes, "
                    "losses))", "return sum(loss.item() for loss in losses) / "
                    "len(losses)")],                             # plain mean of losses
    "strip_module_prefix": [("k[len(prefix):] if k.startswith(prefix) else k",
                             "k.replace(prefix, \"\")")],
    # lab 03
    "shard_indices": [("generator.manual_seed(seed + epoch)",
                       "generator.manual_seed(seed)")],         # no epoch: set_epoch
    "allreduce_worker.py": [("        param.grad /= world_size"
                             "                            # the mean\n", "")],
    "ddp_worker.py": [("        sampler.set_epoch(epoch)             # a new shuffle "
                       "every epoch\n", "")],
    "ddp_script.py": [("torch.cuda.device_count() >= local_world_size",
                       "torch.cuda.is_available()")],           # a backend per process
    # lab 04
    "split_in_two": [("cut = linear[len(linear) // 2]", "cut = linear[1]")],
    "split_step.py": [("F.cross_entropy(out, labels)",
                       "F.cross_entropy(out, labels, reduction=\"sum\")")],
    "overlap_seconds": [("if busy >= 2:", "if busy >= 1:")],     # busy, not overlap
    "split_serve.py": [("    with torch.no_grad():                        # no "
                        "backward: keep no graph\n", "    if True:\n")],
    # lab 05
    "gpipe_table": [("(m + p - 1) + (p - 1 - rank) + i", "(m + p - 1) + rank + i")],
    "gpipe.py": [("out = F.cross_entropy(out, y) / m", "out = F.cross_entropy(out, y)")],
    "one_f_one_b.py": [("warmup = min(num_stages - rank - 1, m)",
                        "warmup = min(num_stages - 1, m)")],
    # lab 06
    "allreduce_timing.py": [("        dist.barrier()                   # every rank "
                             "starts the clock together\n", "")],
    "cast_hook.py": [("(buffer / world_size).to(dtype)", "buffer.to(dtype)")],
    "local_sgd_worker.py": [("param /= world_size", "param /= 1")],   # sum, not mean
    # lab 07
    "bytes_per_rank": [("\"gradients\": num_params * grad_bytes / (n if stage >= 2 else",
                        "\"gradients\": num_params * grad_bytes / (n if stage >= 3 "
                        "else")],
    "zero1_worker.py": [("    dist.all_reduce(grads)                                  "
                         "# sum over the ranks ...\n    grads /= ctx.world_size"
                         "                                 # ... mean, as DDP\n", "")],
    "fsdp_worker.py": [("local = [t.to_local() if isinstance(t, DTensor) else t for t "
                        "in tensors]", "local = list(tensors)")],   # global numel
    "forward_checkpointed": [("x = checkpoint(block, x, use_reentrant=False)",
                              "x = block(x)")],                  # saves everything
    # lab 08
    "tp_mlp.py": [("return ReduceFromParallel.apply(partial) + self.bias",
                   "return ReduceFromParallel.apply(partial + self.bias)")],
    "tp_block.py": [("    block.attn.n_heads //= mesh.size()  # each rank now computes "
                     "n_heads / N heads\n", "")],
    "request_seconds": [("return whole + n * hop", "return whole")],
    "dp_tp.py": [("local /= dp_size", "local /= 1")],
    # lab 09
    "snapshot.py": [("tmp = f\"{path}.tmp\"", "tmp = str(path)")],   # not atomic
    "elastic_train.py": [("return done[-1] if done else None",
                          "return done[0] if done else None")],   # the oldest
    "hang_finder.py": [("        faulthandler.dump_traceback_later(self.seconds, "
                        "repeat=False, file=self.file)\n", "        pass\n")],
    # lab 10 (tests/labs/capstone/test_checks.py has each piece's classic mistakes)
    "tp_gpt.py": [("        dist.all_reduce(total, group=group)       # the sum of the "
                   "partial sums", "        dist.all_reduce(total)")],   # whole world
    "dp_buckets.py": [("            flat /= self.size                 # the sum over "
                       "the group -> the mean\n", "")],
    "pp_gpt.py": [("out = gpt.loss_of(out, targets) / m ",
                   "out = gpt.loss_of(out, targets) ")],
    "gpt3d.py": [("        sync_tied(self.stage, self.tied_group)                # first + last "
                  "stage\n", "")],                             # tied copies drift apart
    "zero1_clip.py": [("            continue                                # the tied copy: "
                       "counted once", "            pass")],    # wte counted twice
    "first_stage_bytes": [("\"optimizer states\": 12 * params",
                           "\"optimizer states\": 8 * params")],   # no fp32 master
    "choose_plans": [("\"8B on 4 nodes\": planner.Plan(dp=32, tp=1, pp=1, "
                      "num_microbatches=8, zero_stage=3)",
                      "\"8B on 4 nodes\": planner.Plan(dp=32, tp=1, pp=1, "
                      "num_microbatches=8, zero_stage=0)")],       # does not fit
}


def wrong_source(key: str, source: str) -> str:
    """Return ``source`` (the exercise's solved code) with its mistake made."""
    assert key in MISTAKES, f"no wrong-but-running version of {key!r}: add one"
    for old, new in MISTAKES[key]:
        count = source.count(old)
        assert count == 1, f"{key}: {old!r} appears {count} times, not once"
        source = source.replace(old, new)
    return source
