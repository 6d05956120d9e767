"""Point-to-point messages that cannot hang a check: bounded waits, mistakes named.

Taught in: labs 04 and 05 (their checks launch the learner's send/recv programs inside
``bounded``). A forgotten send, two blocking sends facing each other, a receive buffer
of the wrong shape or ``None`` instead of a gradient would otherwise hang a rank, or
abort it with a transport error; inside ``bounded`` the rank stops with a
``P2PError`` that says which message, from which rank to which.

Every spelling of a point-to-point message goes through the same guard: blocking
``dist.send``/``dist.recv``, ``dist.isend``/``dist.irecv`` (however imported, as long
as the learner's module is imported inside the block, as ``stages.run_program`` does)
and ``dist.batch_isend_irecv`` with ``dist.P2POp``, in any order within a batch.
Checks run on gloo: ``bounded`` refuses another backend (NCCL ignores message tags,
which the guard's headers need).
"""

import datetime
import json
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from labkit.messages import _

__all__ = ["P2PError", "bounded"]

OPS = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
PEERS_S = 1.0   # how long a stuck rank waits for other stuck ranks to report
HEADER_TAG = 1 << 20   # headers travel on their own tag (+ the message's tag)
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


def _peer(primary, group_peer):
    return primary if primary is not None else group_peer


class _Pending:
    """A send on its way (header, then data); ``wait`` is bounded by the guard.

    ``batch``: the receives posted in the same ``batch_isend_irecv``. Their data
    buffers are posted before this send is waited for: gloo's send ends when the
    peer's buffer is posted, so two ranks that each wait for their batch's send
    first would otherwise wait for each other (the order within a batch is free).
    """

    def __init__(self, works: list, guard, what: str):
        self.works, self.guard, self.what = works, guard, what
        self.batch: list = []

    def wait(self, timeout=None) -> bool:
        for receive in self.batch:
            self.guard._settle(receive)
        for work in self.works:
            self.guard.wait(work, self.what, False)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


class _Receive:
    """A receive: its header is posted at once, its data when the header is checked.

    Data buffers are posted in the order the receives were made (``_Guard._settle``),
    so the data of several receives from one rank matches them in order, whatever
    order they are waited in.
    """

    def __init__(self, guard, op: str, tensor, src, kwargs: dict, what: str):
        self.guard, self.op, self.tensor, self.src = guard, op, tensor, src
        self.kwargs, self.what = kwargs, what
        self.peer = _peer(src, kwargs.get("group_src"))
        self.from_later = self.peer is not None and self.peer > guard.rank
        self.header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64)
        self.data = None
        self.header_work = guard._guarded(lambda: guard.real["irecv"](
            self.header, src, **guard._header_kwargs(kwargs)), what, self.from_later)

    def source(self) -> int:
        """The rank the message came from (known once its header arrived)."""
        return self.peer if self.peer is not None else self.header_work._source_rank()

    def post(self) -> None:
        """Wait for the header, compare it with the buffer, then post the data."""
        self.guard.wait(self.header_work, self.what, self.from_later)
        src, kwargs = self.src, self.kwargs
        if self.peer is None:   # received from any rank: the data from the same one
            src, kwargs = self.source(), {**kwargs, "group_src": None}
        if not torch.equal(self.header, _header(self.tensor)):
            raise P2PError(
                f"labkit check: rank {self.guard.rank} called dist.{self.op}(src="
                f"{self.peer}) with a buffer of shape "
                f"{_describe(_header(self.tensor))}, but rank {self.source()} sent "
                f"{_describe(self.header)}.")
        self.data = self.guard._guarded(lambda: self.guard.real["irecv"](
            self.tensor, src, **kwargs), self.what, self.from_later)

    def wait(self, timeout=None) -> bool:
        self.guard._settle(self)
        self.guard.wait(self.data, self.what, self.from_later)
        return True

    def is_completed(self) -> bool:
        if self.data is None:
            return False
        return self.data.is_completed()


class _Guard:
    """Bounded stand-ins for ``dist.send/recv/isend/irecv`` in one rank.

    ``phase`` (set by the caller: run, step, request) orders the waits of different
    ranks when several are stuck at once (see ``_stuck``).
    """

    def __init__(self, rank: int, wait_s: float, log: list, real: dict):
        self.rank, self.wait_s, self.log, self.real = rank, wait_s, log, real
        self.phase = 0
        self.batches, self._batch = 0, None   # which batch_isend_irecv call (log)
        self._unposted: list[_Receive] = []   # receives whose data is not posted yet

    def wait(self, work, what: str, from_later: bool = False) -> None:
        """Wait for ``work``; ``from_later``: a receive from a later rank (gradient)."""
        self._guarded(lambda: work.wait(timeout=datetime.timedelta(
            seconds=self.wait_s)), what, from_later)

    def _guarded(self, call, what: str, from_later: bool):
        """Run ``call``; a timeout, or a peer that gave up first, means stuck."""
        try:
            return call()
        except RuntimeError as err:
            if "timed out" in str(err).lower():   # a message, or a bounded wait()
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
        store = c10d._get_default_store()
        store.set(f"{_STUCK}/{self.rank}", json.dumps([self.phase, from_later,
                                                         self.rank]))
        time.sleep(PEERS_S)   # other stuck ranks time out at about the same moment
        keys = [f"{_STUCK}/{r}" for r in range(dist.get_world_size())]
        first = min(json.loads(store.get(key)) for key in keys if store.check([key]))
        if first[-1] != self.rank:
            time.sleep(2 * PEERS_S)   # let the rank stuck first be the one reported
        raise P2PError(message) from None

    @staticmethod
    def _header_kwargs(kwargs: dict) -> dict:
        return {**kwargs, "tag": HEADER_TAG + kwargs.get("tag", 0)}

    def _settle(self, receive: _Receive) -> None:
        """Post the data of every receive made before ``receive`` (and its own)."""
        if receive not in self._unposted:
            return
        while self._unposted:
            first = self._unposted.pop(0)
            first.post()
            if first is receive:
                return

    def _note(self, op: str, tensor, peer) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise P2PError(f"labkit check: rank {self.rank} called dist.{op}("
                           f"{tensor!r}, {peer}): that is not a tensor.")
        self.log.append({"op": op, "peer": peer, "shape": tuple(tensor.shape),
                         "requires_grad": tensor.requires_grad, "batch": self._batch})

    def _post_send(self, op, tensor, dst, group, tag, group_dst, what) -> list:
        self._note(op, tensor, _peer(dst, group_dst))
        kwargs = {"group": group, "tag": tag, "group_dst": group_dst}
        return self._guarded(lambda: [
            self.real["isend"](_header(tensor), dst, **self._header_kwargs(kwargs)),
            self.real["isend"](tensor, dst, **kwargs)], what, False)

    def _receive(self, op, tensor, src, group, tag, group_src, what) -> _Receive:
        self._note(op, tensor, _peer(src, group_src))
        receive = _Receive(self, op, tensor, src, {"group": group, "tag": tag,
                                                    "group_src": group_src}, what)
        self._unposted.append(receive)
        return receive

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
        peer = _peer(dst, group_dst)
        what = f"in a blocking dist.send(dst={peer}) that rank {peer} never received"
        _Pending(self._post_send("send", tensor, dst, group, tag, group_dst, what),
                 self, what).wait()

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        peer = _peer(src, group_src)
        what = f"in dist.recv(src={peer}) for a tensor that rank {peer} never sent"
        receive = self._receive("recv", tensor, src, group, tag, group_src, what)
        receive.wait()
        return receive.source()

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> _Pending:
        peer = _peer(dst, group_dst)
        what = f"on a dist.isend(dst={peer}) that rank {peer} never received"
        return _Pending(self._post_send("isend", tensor, dst, group, tag, group_dst,
                                        what), self, what)

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None) -> _Receive:
        peer = _peer(src, group_src)
        what = f"on a dist.irecv(src={peer}) that rank {peer} never sent"
        return self._receive("irecv", tensor, src, group, tag, group_src, what)

    def batch_isend_irecv(self, p2p_op_list):
        """torch's own, with each message it posts logged under this batch's number
        (NCCL runs a batch as one group: ``nccl_order`` reads the numbers)."""
        self.batches += 1
        self._batch = self.batches
        try:
            works = self.real["batch_isend_irecv"](p2p_op_list)
        finally:
            self._batch = None
        receives = [work for work in works if isinstance(work, _Receive)]
        for work in works:
            if isinstance(work, _Pending):
                work.batch = receives
        return works


@contextmanager
def bounded(rank: int, wait_s: float, log: list):
    """Within the block, point-to-point messages give up after ``wait_s`` s.

    ``send``, ``recv``, ``isend``, ``irecv`` and ``batch_isend_irecv`` are replaced in
    ``torch.distributed`` and in ``torch.distributed.distributed_c10d`` (so
    ``dist.P2POp`` and torch's batch take them), by the same objects. Each message is
    preceded by a small header (shape, dtype) on a tag of its own, so a receive
    buffer of the wrong shape is named instead of aborting the process. Every
    message is appended to ``log`` as a dict (op, peer, shape, requires_grad, and
    batch: the number of the ``batch_isend_irecv`` call that posted it, else None;
    ``nccl_order`` replays the log as NCCL would run it). Both
    sides of every message must run inside this block (a check launches all ranks
    so). Yields the guard: set its ``phase`` as the program moves on (checks: per
    run and step), so that when several ranks are stuck the one that got stuck first
    in the exchange is named.
    """
    backend = dist.get_backend()
    if backend != "gloo":
        raise ValueError(_("p2p.bounded runs on gloo (checks launch on gloo), not "
                           "{backend}: NCCL matches messages by order, not by tag."
                           ).format(backend=backend))
    real = {op: getattr(c10d, op) for op in OPS}
    guard = _Guard(rank, wait_s, log, real)
    stand_ins = {op: getattr(guard, op) for op in OPS}   # one object per op
    for module in (dist, c10d):
        for op in OPS:
            setattr(module, op, stand_ins[op])
    try:
        yield guard
    finally:
        for module in (dist, c10d):
            for op in OPS:
                setattr(module, op, real[op])
