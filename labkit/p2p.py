"""Point-to-point messages that cannot hang a check: bounded waits, mistakes named.

Taught in: labs 04 and 05 (their checks launch the learner's send/recv programs inside
``bounded``). A forgotten send, two blocking sends facing each other, a receive buffer
of the wrong shape or ``None`` instead of a gradient would otherwise hang a rank, or
abort it with a transport error; inside ``bounded`` the rank stops with a
``P2PError`` that says which message, from which rank to which.
"""

import datetime
import json
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

__all__ = ["P2PError", "bounded"]

OPS = ("send", "recv", "isend", "irecv")
PEERS_S = 1.0   # how long a stuck rank waits for other stuck ranks to report
_STUCK = "labkit-p2p-stuck"
_GONE = ("Connection closed by peer", "Connection reset by peer")
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.uint8, torch.bool]
_MAX_DIMS = 8


class P2PError(RuntimeError):
    """A point-to-point message of a checked program went wrong; the text says which."""


def _header(tensor: torch.Tensor) -> torch.Tensor:
    """Describe a tensor in 10 int64s: ndim, sizes (padded), dtype (-1: another)."""
    sizes = list(tensor.shape)[:_MAX_DIMS]
    code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
    return torch.tensor([tensor.dim(), *sizes, *[0] * (_MAX_DIMS - len(sizes)), code])


def _describe(header: torch.Tensor) -> str:
    ndim, *rest = header.tolist()
    dtype = str(_DTYPES[rest[-1]]).replace("torch.", "") if rest[-1] >= 0 else "?"
    return f"{tuple(rest[:ndim])} {dtype}"


class _Pending:
    """A message on its way (header, then data); ``wait`` is bounded by the guard."""

    def __init__(self, works: list, guard, what: str, from_later: bool = False):
        self.works, self.guard, self.what = works, guard, what
        self.from_later = from_later

    def wait(self, timeout=None) -> bool:
        for work in self.works:
            self.guard.wait(work, self.what, self.from_later)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


class _Guard:
    """Bounded stand-ins for ``dist.send/recv/isend/irecv`` in one rank.

    ``phase`` (set by the caller: run, step, request) orders the waits of different
    ranks when several are stuck at once (see ``_stuck``).
    """

    def __init__(self, rank: int, wait_s: float, log: list, real: dict):
        self.rank, self.wait_s, self.log, self.real = rank, wait_s, log, real
        self.phase = 0

    def wait(self, work, what: str, from_later: bool = False) -> None:
        """Wait for ``work``; ``from_later``: a receive from a later rank (gradient)."""
        self._guarded(lambda: work.wait(timeout=datetime.timedelta(
            seconds=self.wait_s)), what, from_later)

    def _guarded(self, call, what: str, from_later: bool):
        """Run ``call``; a timeout, or a peer that gave up first, means stuck."""
        try:
            return call()
        except RuntimeError as err:
            if "Timed out" in str(err):
                self._stuck(f"labkit check: rank {self.rank} waited {self.wait_s:g} s "
                            f"{what}.", from_later)
            if any(gone in str(err) for gone in _GONE):   # gloo closes on a timeout
                self._stuck(f"labkit check: rank {self.rank} waited {what} (the other "
                            "rank gave up waiting first).", from_later)
            raise

    def _stuck(self, message: str, from_later: bool):
        """Raise P2PError; of several stuck ranks, the one first in the chain first.

        So the launch reports the cause, not a consequence. First in the chain: the
        earliest phase; within a phase, a rank waiting for activations (from an
        earlier rank) before one waiting for a gradient; then the lower rank.
        """
        store = dist.distributed_c10d._get_default_store()
        store.set(f"{_STUCK}/{self.rank}", json.dumps([self.phase, from_later,
                                                         self.rank]))
        time.sleep(PEERS_S)   # other stuck ranks time out at about the same moment
        keys = [f"{_STUCK}/{r}" for r in range(dist.get_world_size())]
        first = min(json.loads(store.get(key)) for key in keys if store.check([key]))
        if first[-1] != self.rank:
            time.sleep(2 * PEERS_S)   # let the rank stuck first be the one reported
        raise P2PError(message) from None

    def _note(self, op: str, tensor, peer) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise P2PError(f"labkit check: rank {self.rank} called dist.{op}("
                           f"{tensor!r}, {peer}): that is not a tensor.")
        self.log.append({"op": op, "peer": peer, "shape": tuple(tensor.shape),
                         "requires_grad": tensor.requires_grad})

    def _post_send(self, op: str, tensor, dst, args, kwargs, what: str) -> list:
        self._note(op, tensor, dst)
        return self._guarded(lambda: [
            self.real["isend"](_header(tensor), dst, *args, **kwargs),
            self.real["isend"](tensor, dst, *args, **kwargs)], what, False)

    def _post_recv(self, op: str, tensor, src, args, kwargs, what: str) -> list:
        """Wait for the header, compare it with the buffer, then post the data."""
        self._note(op, tensor, src)
        later = src is not None and src > self.rank
        header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64)
        posted = self._guarded(
            lambda: self.real["irecv"](header, src, *args, **kwargs), what, later)
        self.wait(posted, what, later)
        if not torch.equal(header, _header(tensor)):
            raise P2PError(
                f"labkit check: rank {self.rank} called dist.{op}(src={src}) with a "
                f"buffer of shape {_describe(_header(tensor))}, but rank {src} sent "
                f"{_describe(header)}.")
        return self._guarded(lambda: [self.real["irecv"](tensor, src, *args, **kwargs)],
                             what, later)

    def send(self, tensor, dst=None, *args, **kwargs) -> None:
        what = f"in a blocking dist.send(dst={dst}) that rank {dst} never received"
        _Pending(self._post_send("send", tensor, dst, args, kwargs, what), self,
                 what).wait()

    def recv(self, tensor, src=None, *args, **kwargs):
        what = f"in dist.recv(src={src}) for a tensor that rank {src} never sent"
        _Pending(self._post_recv("recv", tensor, src, args, kwargs, what), self, what,
                 from_later=src is not None and src > self.rank).wait()
        return src

    def isend(self, tensor, dst=None, *args, **kwargs) -> _Pending:
        what = f"on a dist.isend(dst={dst}) that rank {dst} never received"
        return _Pending(self._post_send("isend", tensor, dst, args, kwargs, what), self,
                        what)

    def irecv(self, tensor, src=None, *args, **kwargs) -> _Pending:
        what = f"on a dist.irecv(src={src}) that rank {src} never sent"
        return _Pending(self._post_recv("irecv", tensor, src, args, kwargs, what), self,
                        what, from_later=src is not None and src > self.rank)


@contextmanager
def bounded(rank: int, wait_s: float, log: list):
    """Within the block, ``dist.send/recv/isend/irecv`` give up after ``wait_s`` s.

    Each message is preceded by a small header (shape, dtype), so a receive buffer of
    the wrong shape is named instead of aborting the process. Every message is
    appended to ``log`` as a dict (op, peer, shape, requires_grad). Both sides of
    every message must run inside this block (a check launches all ranks so). An
    ``irecv`` waits for the header before it returns. Yields the guard: set its
    ``phase`` as the program moves on (checks: per run and step), so that when
    several ranks are stuck the one that got stuck first in the exchange is named.
    """
    real = {op: getattr(dist, op) for op in OPS}
    guard = _Guard(rank, wait_s, log, real)
    for op in OPS:
        setattr(dist, op, getattr(guard, op))
    try:
        yield guard
    finally:
        for op in OPS:
            setattr(dist, op, real[op])
