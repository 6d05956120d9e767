"""The capstone's text: CPython's own language reference, read as bytes.

Taught in: lab 10. ``pydoc_data.topics`` ships with every CPython (it is what
``help("assert")`` prints): about 80 topics of the language reference, some 460 KB of
English prose and grammar, under the PSF License Agreement like the rest of CPython's
standard library. Bytes are the tokens (vocabulary 256), so nothing is downloaded and
no tokenizer is trained. The text differs a little between Python versions: a check
reads it once in the notebook's process and sends the same tokens to every rank.
"""

import sys

import torch

from labkit.messages import N_, Said, _

__all__ = ["VOCAB_SIZE", "LICENCE", "text", "tokens", "split", "batches", "decode",
           "python_version"]

VOCAB_SIZE = 256   # one token per byte value
# Said: it prints in the learner's language; the licence's own name stays English.
LICENCE = Said(N_("PSF License Agreement (CPython's Lib/pydoc_data/topics.py)"))


def text() -> str:
    """Return the language reference's topics, in sorted order, as one string."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def tokens() -> torch.Tensor:
    """Return the text's UTF-8 bytes as an int64 tensor (one token per byte)."""
    data = text().encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def split(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple:
    """Return (train, validation): the first 90 % and the last 10 % of the tokens."""
    if not 0 < val_fraction < 1:
        raise ValueError(_("val_fraction must be between 0 and 1, got {value!r}."
                           ).format(value=val_fraction))
    cut = int(len(ids) * (1 - val_fraction))
    return ids[:cut], ids[cut:]


def batches(ids: torch.Tensor, steps: int, batch: int, context: int,
            seed: int = 0) -> torch.Tensor:
    """Return (steps, batch, context + 1) windows of ``ids`` at seeded random offsets.

    Inputs are ``window[:, :-1]``, targets ``window[:, 1:]`` (the next byte).
    """
    if len(ids) <= context + 1:
        raise ValueError(_("{n} tokens cannot make windows of {context} + 1 tokens."
                           ).format(n=len(ids), context=context))
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - context - 1, (steps, batch),
                           generator=generator)
    offsets = torch.arange(context + 1)
    return ids[starts[..., None] + offsets]


def decode(ids) -> str:
    """Return the text of a sequence of byte tokens (a bad UTF-8 byte shows as �)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def python_version() -> str:
    """The Python whose text this is (the text changes a little between versions)."""
    return ".".join(map(str, sys.version_info[:3]))
