"""A small GPT, honestly built: token and position embeddings, pre-norm blocks of causal
multi-head attention and an MLP, a final LayerNorm and an output tied to the embedding.

Taught in: lab 10. The same architecture as GPT-2 (Radford et al. 2019) and nanoGPT,
at toy size. Attention keeps q, k, v and the output projection as separate
``nn.Linear`` so that a tensor-parallel split can name each one, and ``blocks`` is an
``nn.ModuleList``: a pipeline stage that keeps blocks 2 and 3 can keep their names
(``blocks.2.attn.q.weight``). No dropout: every layout must compute the same numbers.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit.messages import _

__all__ = ["GPTConfig", "Attention", "MLP", "Block", "GPT", "build", "loss_of",
           "generate"]


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape and the seed its weights are drawn from."""

    vocab_size: int = 256
    context: int = 128       # the longest sequence it reads (position embeddings)
    width: int = 128         # C: every block reads and writes (B, T, C)
    num_layers: int = 4
    num_heads: int = 4
    seed: int = 0
    # The spread of q's and k's weights at initialisation. GPT-2's 0.02 makes attention
    # nearly uniform at first, so a softmax scale off by sqrt(2), or a missing causal
    # mask, barely moves the numbers; lab 10's checks draw them larger (0.3: scores of
    # a few units) so that every such mistake shows far above the tolerance.
    attention_std: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "context", "width", "num_layers", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(_("GPTConfig.{name} must be a positive integer, got "
                                   "{value!r}.").format(name=name, value=value))
        if not isinstance(self.attention_std, (int, float)) or not self.attention_std > 0:
            raise ValueError(_("GPTConfig.attention_std must be a positive number, got "
                               "{value!r}.").format(value=self.attention_std))
        if self.width % self.num_heads:
            raise ValueError(_("width = {width} does not split into num_heads = "
                               "{heads} heads of equal size.").format(
                                   width=self.width, heads=self.num_heads))


class Attention(nn.Module):
    """Causal multi-head self-attention: q, k, v, then the output projection.

    ``num_heads`` is how many heads *this* module computes: a tensor-parallel rank
    that keeps 1/N of q, k and v's output features computes num_heads / N of them.
    """

    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, width // num_heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        # What the checks' hints change to recognise a classic mistake: another
        # softmax scale (None: 1/sqrt(head_dim)), or no causal mask.
        self.scale, self.causal = None, True

    def forward(self, x):
        batch, seq, _ = x.shape                                       # (B, T, C)
        q, k, v = (proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))              # (B, h, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           scale=self.scale)
        y = y.transpose(1, 2).reshape(batch, seq, -1)                 # (B, T, h*hs)
        return self.out(y)                                            # (B, T, C)


class MLP(nn.Module):
    """fc1 (C -> 4C), GELU, fc2 (4C -> C)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, num_heads)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Tokens (B, T) -> logits (B, T, vocab); the output layer is ``wte`` itself."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.width)   # token embedding
        self.wpe = nn.Embedding(cfg.context, cfg.width)      # position embedding
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.num_heads)
                                    for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.width)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)                       # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)               # tied output


def _initialise(model: GPT) -> None:
    """GPT-2's initialisation, except that biases start small and random (GPT-2 starts
    them at 0), so that a bias added in the wrong place shows from the first step."""
    residual_std = 0.02 / math.sqrt(2 * model.cfg.num_layers)
    for name, param in model.named_parameters():
        if name.endswith("bias") and "norm" not in name and "ln_f" not in name:
            nn.init.normal_(param, std=0.02)
        elif name.endswith(("attn.out.weight", "mlp.fc2.weight")):
            nn.init.normal_(param, std=residual_std)   # the projections into x
        elif name.endswith(("attn.q.weight", "attn.k.weight")):
            nn.init.normal_(param, std=model.cfg.attention_std)
        elif param.dim() == 2:
            nn.init.normal_(param, std=0.02)


def build(cfg: GPTConfig) -> GPT:
    """Return the GPT with the weights drawn from ``cfg.seed``: equal in every process.

    The global random state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = GPT(cfg)
        _initialise(model)
    return model


def loss_of(logits, targets):
    """Mean cross-entropy of (B, T, vocab) logits and (B, T) targets, every token."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def generate(model: GPT, prompt, new_tokens: int, temperature: float = 0.8,
             top_k: int = 20, seed: int = 0) -> list:
    """Return ``prompt`` (a list of byte tokens) and ``new_tokens`` sampled after it.

    Samples from the ``top_k`` most likely bytes at ``temperature``, seeded.
    """
    if not prompt:
        raise ValueError(_("generate needs a prompt of at least one token."))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([list(prompt)])
    was_training = model.training
    model.eval()
    for _step in range(new_tokens):
        logits = model(ids[:, -model.cfg.context:])[0, -1] / temperature
        kept, where = logits.topk(min(top_k, logits.numel()))
        choice = torch.multinomial(F.softmax(kept, -1), 1, generator=generator)
        ids = torch.cat([ids, where[choice][None]], dim=1)
    model.train(was_training)
    return ids[0].tolist()
