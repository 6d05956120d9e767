"""Which rank holds which part of the GPT on a (pp, dp, tp) mesh, and the run's config.

Taught in: lab 10. Ranks are laid out as ``init_device_mesh(device_type, (pp, dp, tp),
mesh_dim_names=("pp", "dp", "tp"))`` lays them out: the last dimension varies fastest,
so rank = (pp_rank * dp + dp_rank) * tp + tp_rank. On 8 ranks (2 x 2 x 2): TP pairs
[0, 1] [2, 3] [4, 5] [6, 7] (neighbours: one node's NVLink on a real cluster), DP pairs
[0, 2] [1, 3] [4, 6] [5, 7], pipeline pairs [0, 4] [1, 5] [2, 6] [3, 7].

``shard`` cuts the whole GPT's tensors the way every layout must hold them: stage s
keeps its consecutive share of the L blocks (L // pp each, the first L % pp stages one
more, as exercise 10.5 counts them), the embeddings ``wte`` and ``wpe`` on the first
stage, ``ln_f`` and a copy of the tied ``wte`` on the last; inside a block, TP rank t
keeps q, k, v and fc1's t-th block of output features (rows: whole heads) and out and
fc2's t-th block of input features (columns); biases of out and fc2, and the norms,
stay whole.
"""

import functools
import itertools
from dataclasses import dataclass, field

from labkit.labs.capstone.gpt import GPTConfig
from labkit.labs.capstone.plan_costs import layers_per_stage
from labkit.messages import _

__all__ = ["RunConfig", "Coords", "coords", "rank_of", "group_ranks", "stage_blocks",
           "is_split", "tp_part", "shard", "assemble", "canonical", "layouts"]

DIMS = ("pp", "dp", "tp")
_ROWS = ("attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias",
         "attn.v.weight", "attn.v.bias", "mlp.fc1.weight", "mlp.fc1.bias")
_COLUMNS = ("attn.out.weight", "mlp.fc2.weight")


@dataclass(frozen=True)
class RunConfig:
    """One training run: the model, the mesh, the pipeline's micro-batches, the
    optimizer ("sgd" for the exactness checks, "adamw" to train) and DP's buckets."""

    model: GPTConfig = field(default_factory=GPTConfig)
    dp: int = 2
    tp: int = 2
    pp: int = 2
    num_microbatches: int = 4
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    bucket_bytes: int = 2**16
    max_norm: float | None = None   # clip the whole model's gradient to this L2 norm

    def __post_init__(self):
        for name in DIMS + ("num_microbatches", "bucket_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(_("RunConfig.{name} must be a positive integer, got "
                                   "{value!r}.").format(name=name, value=value))
        if self.model.num_layers < self.pp:
            raise ValueError(_("{layers} blocks cannot fill pp = {pp} pipeline stages: "
                               "every stage needs at least one block. Use pp <= "
                               "{layers}, or a GPTConfig with more layers.").format(
                                   layers=self.model.num_layers, pp=self.pp))
        if self.model.num_heads % self.tp:
            raise ValueError(_("{heads} heads do not split over tp = {tp} ranks."
                               ).format(heads=self.model.num_heads, tp=self.tp))
        if self.max_norm is not None and not (isinstance(self.max_norm, (int, float))
                                              and self.max_norm > 0):
            raise ValueError(_("RunConfig.max_norm must be a positive number or None, "
                               "got {value!r}.").format(value=self.max_norm))
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(_("RunConfig.optimizer must be 'sgd' or 'adamw', got "
                               "{value!r}.").format(value=self.optimizer))

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def name(self) -> str:
        return f"dp={self.dp} tp={self.tp} pp={self.pp}"


@dataclass(frozen=True)
class Coords:
    """Where one rank sits on the mesh."""

    pp: int
    dp: int
    tp: int


def coords(cfg: RunConfig, rank: int) -> Coords:
    """Return rank ``rank``'s (pp, dp, tp) coordinates: the last dimension fastest."""
    if not 0 <= rank < cfg.world_size:
        raise ValueError(_("rank {rank} is not on a mesh of {n} ranks.").format(
            rank=rank, n=cfg.world_size))
    return Coords(rank // (cfg.dp * cfg.tp), rank // cfg.tp % cfg.dp, rank % cfg.tp)


def rank_of(cfg: RunConfig, where: Coords) -> int:
    """Return the rank at ``where`` (the inverse of ``coords``)."""
    return (where.pp * cfg.dp + where.dp) * cfg.tp + where.tp


def group_ranks(cfg: RunConfig, rank: int, dim: str) -> list[int]:
    """Return the ranks of ``rank``'s group along ``dim`` ("pp", "dp" or "tp")."""
    here = coords(cfg, rank).__dict__
    return [rank_of(cfg, Coords(**{**here, dim: i})) for i in range(getattr(cfg, dim))]


def stage_blocks(cfg: RunConfig, pp_rank: int) -> range:
    """Return the indices of the blocks pipeline stage ``pp_rank`` holds: L // pp
    each, and one more on each of the first L % pp stages (3 blocks on 2 stages: 0-1
    and 2)."""
    counts = layers_per_stage(cfg.model.num_layers, cfg.pp)   # the planner's rule
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])


def _on_stage(cfg: RunConfig, name: str, pp_rank: int) -> bool:
    first, last = pp_rank == 0, pp_rank == cfg.pp - 1
    if name.startswith("blocks."):
        return int(name.split(".")[1]) in stage_blocks(cfg, pp_rank)
    return {"wte.weight": first or last, "wpe.weight": first,
            "ln_f.weight": last, "ln_f.bias": last}[name]


def is_split(name: str) -> bool:
    """Whether TP splits the whole GPT's tensor ``name`` (blocks.0.attn.q.weight:
    yes; a norm, out's or fc2's bias, an embedding: every TP rank holds it whole)."""
    return ".".join(name.split(".")[2:]) in _ROWS + _COLUMNS


def tp_part(local: str, tensor, tp_rank: int, tp: int):
    """TP rank ``tp_rank``'s part of a block's tensor named ``local`` (attn.q.weight):
    a block of rows or columns, or the whole tensor when it is not split."""
    if local in _ROWS:
        rows = tensor.shape[0] // tp
        return tensor[tp_rank * rows:(tp_rank + 1) * rows]
    if local in _COLUMNS:
        cols = tensor.shape[1] // tp
        return tensor[:, tp_rank * cols:(tp_rank + 1) * cols]
    return tensor


def shard(whole: dict, cfg: RunConfig, rank: int) -> dict:
    """Return {name: tensor} rank ``rank`` holds of the whole GPT's ``whole`` tensors
    (weights or gradients), named as in the whole GPT."""
    where = coords(cfg, rank)
    # blocks.3.attn.q.weight -> attn.q.weight; other names are not split
    return {name: tp_part(".".join(name.split(".")[2:]), tensor, where.tp, cfg.tp)
            for name, tensor in whole.items() if _on_stage(cfg, name, where.pp)}


def assemble(shards: list, cfg: RunConfig) -> dict:
    """Return the whole GPT's tensors from every rank's ``shards`` (of DP replica 0)."""
    import torch

    whole = {}
    for pp_rank, tp_rank in itertools.product(range(cfg.pp), range(cfg.tp)):
        held = shards[rank_of(cfg, Coords(pp_rank, 0, tp_rank))]
        for name, tensor in held.items():
            local = ".".join(name.split(".")[2:])
            if local in _ROWS or local in _COLUMNS:
                whole.setdefault(name, [None] * cfg.tp)[tp_rank] = tensor
            else:
                whole.setdefault(name, tensor)
    for name, parts in whole.items():
        if isinstance(parts, list):
            local = ".".join(name.split(".")[2:])
            whole[name] = torch.cat(parts, dim=0 if local in _ROWS else 1)
    return whole


def _subsequence(short: list, long: list) -> bool:
    found = iter(long)
    return all(atom in found for atom in short)


def canonical(named: dict, known) -> dict:
    """Name each tensor as the whole GPT does, whatever module holds it.

    ``blocks.2.attn.q.weight`` stays; ``blocks.2.attn.q.linear.weight`` (an nn.Linear
    kept inside) or ``module.wte.weight`` (a wrapper) become the known name whose atoms
    they contain in order, when exactly one known name fits; other names stay.
    """
    names = _canonical_names(tuple(named), tuple(known))
    return dict(zip(names, named.values()))   # a later tensor of one name wins


@functools.lru_cache(maxsize=64)   # a rank asks with the same names at every step
def _canonical_names(names: tuple, known: tuple) -> tuple:
    found = []
    for name in names:
        atoms = name.split(".")
        fits = [k for k in known if k == name or (
            k.split(".")[-1] == atoms[-1] and _subsequence(k.split("."), atoms))]
        exact = name if name in known else None
        found.append(exact or (fits[0] if len(fits) == 1 else name))
    return tuple(found)


def layouts(cfg: RunConfig) -> list[RunConfig]:
    """Return ``cfg`` with every subset of its dimensions switched off (set to 1),
    from one process to the whole mesh."""
    from dataclasses import replace

    on = [dim for dim in DIMS if getattr(cfg, dim) > 1]
    found = []
    for count in range(len(on) + 1):
        for kept in itertools.combinations(on, count):
            found.append(replace(cfg, **{dim: getattr(cfg, dim) if dim in kept else 1
                                         for dim in DIMS}))
    return found
