"""Lab 10, exercise 10.3, another idiom (plain isend/irecv, receives posted first on
the later stage of each pair, no batches): the GPT cut into pipeline stages, trained with 1F1B, its
messages safe on NCCL (流水线并行).

A stage keeps its blocks under their names in the whole GPT (``blocks.2...``), the
embeddings on the first stage, the final norm and a copy of the tied ``wte`` on the
last. Between stages go activations (B, T, C) forward and their gradients back.

NCCL runs a rank's sends and receives to one peer in order, on one stream, and a send
does not finish until the peer's matching receive runs. In 1F1B's steady state stage
s sends activations forward while stage s + 1 sends a gradient back: if both send
first, each waits for a receive the other never reaches. So a send and the receive
it is paired with go in one ``dist.batch_isend_irecv`` (Megatron-LM's
send_forward_recv_backward). gloo accepts either order.
"""
import torch
import torch.distributed as dist
from torch import nn

from labkit.labs.capstone import gpt


class Stage(nn.Module):
    """Pipeline stage ``pp_rank`` of ``pp_size`` of ``model`` (a gpt.GPT)."""

    def __init__(self, model, pp_rank, pp_size):
        super().__init__()
        self.first, self.last = pp_rank == 0, pp_rank == pp_size - 1
        sizes = [len(model.blocks) // pp_size + (s < len(model.blocks) % pp_size)
                 for s in range(pp_size)]
        kept = range(sum(sizes[:pp_rank]), sum(sizes[:pp_rank + 1]))
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in kept})
        self.wte = model.wte if self.first or self.last else None   # tied: both ends
        self.wpe = model.wpe if self.first else None
        self.ln_f = model.ln_f if self.last else None

    def forward(self, x):        # first stage: tokens (B, T); the others: (B, T, C)
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(positions)
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = torch.nn.functional.linear(self.ln_f(x), self.wte.weight)   # logits
        return x


def _post(ops, group):
    """Post ``ops`` [("send" or "recv", tensor, group peer)] one by one, in this order."""
    works = []
    for kind, tensor, peer in ops:
        if kind == "send":
            works.append(dist.isend(tensor, group=group, group_dst=peer))
        else:
            works.append(dist.irecv(tensor, group=group, group_src=peer))
    return works


def one_f_one_b(stage, microbatches, shape, group):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    m = len(microbatches)
    device = microbatches[0][0].device
    inputs, outputs, total = {}, {}, 0.0
    # Megatron's order: forward i after receiving its input, backward i after
    # receiving its gradient. The earlier rank of a pair sends first, the later
    # receives first, so both list the pair's messages in the same order.
    warmup = min(size - rank - 1, m)
    schedule = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        schedule += [("F", warmup + i), ("B", i)]
    schedule += [("B", i) for i in range(m - warmup, m)]
    pending_input = None
    for kind, i in schedule:
        if kind == "F":
            x, targets = microbatches[i]
            if not stage.first:
                if pending_input is None:
                    buffer = torch.empty(shape, device=device)
                    for work in _post([("recv", buffer, rank - 1)], group):
                        work.wait()
                    pending_input = buffer
                x = pending_input.requires_grad_()
                pending_input = None
            out = stage(x)
            if stage.last:
                out = gpt.loss_of(out, targets) / m
                total += out.item()
            else:
                for work in _post([("send", out.detach(), rank + 1)], group):
                    work.wait()
            inputs[i], outputs[i] = x, out
        else:
            grad = None
            if not stage.last:
                grad = torch.empty(shape, device=device)
                for work in _post([("recv", grad, rank + 1)], group):
                    work.wait()
            outputs.pop(i).backward(grad)
            x = inputs.pop(i)
            if not stage.first:
                ops = []
                if i + 1 < m - warmup:                  # the next F needs an input
                    pending_input = torch.empty(shape, device=device)
                    ops.append(("recv", pending_input, rank - 1))   # receive first
                ops.append(("send", x.grad, rank - 1))
                for work in _post(ops, group):
                    work.wait()
    return total if stage.last else None


def sync_tied(stage, group):
    """Add up the tied embedding's two gradients (the first stage's lookup, the last
    stage's output layer) over ``group``, which holds exactly those two stages."""
    if dist.get_world_size(group) > 1 and stage.wte is not None:
        dist.all_reduce(stage.wte.weight.grad, group=group)
