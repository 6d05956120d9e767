"""Lab 10, exercise 10.4 with process groups made by hand (dist.new_group), no
DeviceMesh; the rank's coordinates computed from its number."""
import torch
import torch.distributed as dist

from dp_buckets import Buckets
from labkit.labs.capstone import gpt, reference
from pp_gpt import Stage, one_f_one_b, sync_tied
from tp_gpt import parallelize_block


def make_groups(rank, pp, dp, tp):
    """Every rank creates every group, in one order; keep the three that hold it."""
    mine = {}
    grid = [[[(p * dp + d) * tp + t for t in range(tp)] for d in range(dp)]
            for p in range(pp)]
    candidates = {
        "tp": [grid[p][d] for p in range(pp) for d in range(dp)],
        "dp": [[grid[p][d][t] for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[grid[p][d][t] for p in range(pp)] for d in range(dp) for t in range(tp)],
        # the tied wte: each pipeline's two ends (one rank when pp = 1)
        "tied": [sorted({grid[0][d][t], grid[-1][d][t]}) for d in range(dp)
                 for t in range(tp)],
    }
    for name, groups in candidates.items():
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine


class Trainer:
    def __init__(self, ctx, cfg):
        self.cfg = cfg
        self.groups = make_groups(ctx.rank, cfg.pp, cfg.dp, cfg.tp)
        self.pp_rank = ctx.rank // (cfg.dp * cfg.tp)
        self.dp_rank = ctx.rank // cfg.tp % cfg.dp
        self.stage = Stage(gpt.build(cfg.model), self.pp_rank, cfg.pp).to(ctx.device)
        for block in self.stage.blocks.values():
            parallelize_block(block, self.groups["tp"])
        params = list(self.stage.parameters())
        self.buckets = Buckets(params, self.groups["dp"], cfg.bucket_bytes,
                               accumulations=cfg.num_microbatches)
        self.optimizer = reference.make_optimizer(params, cfg)

    def step(self, tokens):
        cfg = self.cfg
        share = tokens.shape[0] // cfg.dp
        mine = tokens[self.dp_rank * share:(self.dp_rank + 1) * share]
        size = share // cfg.num_microbatches
        microbatches = [(mine[i:i + size, :-1], mine[i:i + size, 1:])
                        for i in range(0, share, size)]
        self.optimizer.zero_grad()
        loss = one_f_one_b(self.stage, microbatches, (size, tokens.shape[1] - 1,
                                                      cfg.model.width), self.groups["pp"])
        self.buckets.wait()
        if "tied" in self.groups:                 # a middle stage holds no wte
            sync_tied(self.stage, self.groups["tied"])
        self.optimizer.step()
        if self.pp_rank != cfg.pp - 1:
            return None
        total = torch.tensor([loss / cfg.dp], device=tokens.device)
        dist.all_reduce(total, group=self.groups["dp"])
        return total.item()
