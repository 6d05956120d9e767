"""The models lab 08 splits inside their layers, and the unsplit runs they are checked
against.

Taught in: lab 08 (tensor parallelism, 张量并行). ``MLP`` is the Megatron MLP
(Linear, GELU, Linear); ``Block`` a small pre-norm transformer block whose attention
keeps q, k, v and the output projection as separate ``nn.Linear`` (so a
``parallelize_module`` plan can name each one). ``unsplit`` runs a model whole, in
this process: the truth every split run is compared with.
"""

import torch
import torch.nn.functional as F
from torch import nn

from labkit.messages import _

__all__ = ["MLP", "Attention", "Block", "check_divisible", "probe", "unsplit",
           "mlp_blocks", "full_tensors", "saved_activation_bytes", "draw_mlp_split",
           "draw_mesh"]

RANK_COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]


class MLP(nn.Module):
    """fc1 (dim -> hidden), GELU, fc2 (hidden -> dim): a transformer block's MLP."""

    def __init__(self, dim: int = 16, hidden: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v and out projections.

    ``n_heads`` is how many heads *this* module computes: a tensor-parallel rank that
    holds 1/N of the q, k, v features must compute n_heads / N of them.
    """

    def __init__(self, dim: int = 32, n_heads: int = 4):
        super().__init__()
        check_divisible(dim, n_heads, "dim", "n_heads")
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, seq, _ = x.shape                                   # (B, T, C)
        q, k, v = (proj(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))          # (B, heads, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim)
        return self.out(y)                                        # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then + mlp(norm2(x))."""

    def __init__(self, dim: int = 32, n_heads: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def check_divisible(size: int, world_size: int, what: str = "size",
                    by: str | None = None) -> None:
    """Raise ValueError, with the numbers, unless ``size`` splits in ``world_size``.

    ``by`` names ``world_size`` (default: "the tensor-parallel degree", in the
    learner's language). ``torch.chunk`` would silently hand out uneven blocks (10
    rows in 4: 3, 3, 3, 1).
    """
    if world_size < 1 or size % world_size:
        raise ValueError(_(
            "{what} = {size} does not split evenly over {by} = {world_size} "
            "({size} / {world_size} = {ratio:g}): choose sizes divisible by "
            "{world_size}, or another degree.").format(
                what=what, size=size, world_size=world_size,
                by=_("the tensor-parallel degree") if by is None else by,
                ratio=size / max(world_size, 1)))


def probe(shape, seed: int = 1) -> torch.Tensor:
    """Return a fixed random tensor: the loss (out * probe).sum() uses every output."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


def unsplit(model: nn.Module, x: torch.Tensor, seed: int = 1) -> dict:
    """Run ``model`` whole on ``x``: output, input gradient and parameter gradients.

    The loss is ``(out * probe(out.shape, seed)).sum()``, as in the split runs.
    """
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * probe(out.shape, seed)).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {name: p.grad.clone() for name, p in model.named_parameters()}}


def mlp_blocks(tensors: dict, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s blocks of an MLP's {name: tensor} (weights, or their gradients).

    The Megatron split: fc1 by output features (rows of its (out, in) weight), fc2 by
    the matching input features (columns); fc2's bias stays whole.
    """
    k = tensors["fc1.weight"].shape[0] // world_size
    block = slice(rank * k, (rank + 1) * k)
    return {"fc1.weight": tensors["fc1.weight"][block],
            "fc1.bias": tensors["fc1.bias"][block],
            "fc2.weight": tensors["fc2.weight"][:, block],
            "fc2.bias": tensors["fc2.bias"]}


def full_tensors(tensors: dict) -> dict:
    """Gather each DTensor of ``{name: tensor}`` into a whole tensor on the CPU.

    A collective when there are DTensors: every rank of their mesh must call it.
    """
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()
            for name, t in tensors.items()}


def _storage(tensor):
    """Return the storage holding ``tensor``'s data here (a DTensor's local shard)."""
    return getattr(tensor, "_local_tensor", tensor).untyped_storage()


def saved_activation_bytes(model: nn.Module, fn) -> tuple:
    """Call ``fn()``; return (its result, bytes autograd saved here for backward).

    ``model``'s parameters are not counted; each storage counts once; a DTensor
    counts its local shard (what this rank holds).
    """
    seen = {_storage(p).data_ptr() for p in model.parameters()}
    total = [0]

    def pack(tensor):
        storage = _storage(tensor)
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total[0] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return result, total[0]


# ---------------------------------------------------------------- pictures


def draw_mlp_split(world_size: int = 2, ax=None):
    """Draw fc1's weight cut into row blocks and fc2's into column blocks, one colour
    per rank: what each rank keeps in the Megatron MLP."""
    import matplotlib.pyplot as plt

    from labkit.timeline import use_cjk_font

    use_cjk_font()
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    hidden, dim, gap = 8, 3, 4   # drawing units: hidden = 4 x dim, as in the MLP
    rows = hidden / world_size
    for rank in range(world_size):
        colour = RANK_COLOURS[rank % len(RANK_COLOURS)]
        # fc1.weight is (hidden, dim): rows; fc2.weight is (dim, hidden): columns
        ax.add_patch(plt.Rectangle((0, hidden - (rank + 1) * rows), dim, rows,
                                   color=colour, alpha=0.8))
        ax.add_patch(plt.Rectangle((dim + gap + rank * rows, 2.5), rows, dim,
                                   color=colour, alpha=0.8))
        ax.text(-0.3, hidden - (rank + 0.5) * rows, f"rank {rank}", va="center",
                ha="right")
    ax.annotate("", xy=(dim + gap - 0.3, 4), xytext=(dim + 0.3, 4),
                arrowprops={"arrowstyle": "->"})
    ax.text(dim + gap / 2, 4.4, "GELU\n" + _("no messages"), ha="center", va="bottom",
            fontsize=8)
    ax.text(dim / 2, -0.4, _("fc1.weight (hidden, dim):\nrows = output features"),
            ha="center", va="top", fontsize=9)
    ax.text(dim + gap + hidden / 2, 2.1, _("fc2.weight (dim, hidden):\ncolumns = input "
                                           "features;\npartial sums -> one all-reduce"),
            ha="center", va="top", fontsize=9)
    ax.set_xlim(-2, dim + gap + hidden + 0.5)
    ax.set_ylim(-1.8, hidden + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def draw_mesh(ax=None):
    """Draw 2 nodes x 2 GPUs: TP pairs inside a node (NVLink), DP pairs across nodes."""
    import matplotlib.pyplot as plt

    from labkit.timeline import use_cjk_font

    use_cjk_font()
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    spots = {0: (0, 1), 1: (1.5, 1), 2: (0, -1), 3: (1.5, -1)}   # rank -> (x, y)
    for node, y in ((0, 1), (1, -1)):
        ax.add_patch(plt.Rectangle((-0.6, y - 0.55), 2.7, 1.1, fill=False, ls="--"))
        ax.text(2.25, y, _("node {node}").format(node=node), va="center")
    for a, b in ((0, 1), (2, 3)):
        ax.plot(*zip(spots[a], spots[b]), color=RANK_COLOURS[0], lw=4)
    for a, b in ((0, 2), (1, 3)):
        ax.plot(*zip(spots[a], spots[b]), color=RANK_COLOURS[1], lw=2, ls=":")
    for rank, (x, y) in spots.items():
        ax.add_patch(plt.Circle((x, y), 0.3, color="white", ec="black", zorder=3))
        ax.text(x, y, f"GPU\nrank {rank}", ha="center", va="center", zorder=4,
                fontsize=8)
    ax.plot([], [], color=RANK_COLOURS[0], lw=4,
            label=_("TP group: NVLink, every layer"))
    ax.plot([], [], color=RANK_COLOURS[1], lw=2, ls=":",
            label=_("DP group: network, once per step"))
    ax.legend(loc="upper left", bbox_to_anchor=(1.15, 1), fontsize=8)
    ax.set_xlim(-0.8, 3)
    ax.set_ylim(-1.8, 1.8)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax
