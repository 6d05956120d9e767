"""Record, in one rank, every collective and message it sends: what, to which group, how
many bytes, in which phase of the step.

Taught in: lab 10 (the messages per mesh dimension are counted from this log, not
from a formula). ``Recorder`` replaces ``all_reduce`` (and, when asked,
``send``/``recv``/``isend``/``irecv``) in ``torch.distributed`` and its
``distributed_c10d``, and marks where each ``batch_isend_irecv`` begins and ends, so
that ``nccl_order`` can see which messages travelled together.

Under ``p2p.bounded`` (``guard``) a blocking all-reduce waits as long as a message
may, then stops naming its group: a group that holds a rank which never calls it
(a tied embedding all-reduced over a whole pipeline whose middle stages hold none)
becomes a verdict, not a hang.

``lazy=True`` (the checks) holds back every asynchronous all-reduce until its handle
is waited for, as a network slow enough would: a program that steps its optimizer
before waiting for a bucket then always steps on un-averaged gradients, instead of
only when it loses a race. Handles are launched in the order they were made, so
every rank of a group still calls the group's collectives in one order.
"""

import inspect
import time
from contextlib import contextmanager

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["Recorder", "group_of"]

P2P = ("send", "recv", "isend", "irecv")


def group_of(group) -> tuple:
    """The global ranks of ``group`` (None: the default group), as a tuple."""
    return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))


class _Deferred:
    """An asynchronous all-reduce not launched yet: ``wait`` launches it (and every
    one made before it), then waits."""

    def __init__(self, recorder, launch):
        self.recorder, self.launch, self.work = recorder, launch, None

    def _start(self):
        self.recorder.release(self)
        return self.work

    def wait(self, timeout=None):
        work = self._start()
        return work.wait() if timeout is None else work.wait(timeout)

    def is_completed(self) -> bool:
        return self.work is not None and self.work.is_completed()

    def get_future(self):
        return self._start().get_future()

    def result(self):
        return self._start().result()

    def synchronize(self):
        return self._start().synchronize()


class _Together:
    """One handle of a batch posted op by op under ``p2p.bounded``: waiting for it first
    posts the buffers of the batch's receives, as one batch posts them all at once
    (the bounded receive posts its buffer only when it is waited for)."""

    def __init__(self, handle, batch: list):
        self.handle, self.batch = handle, batch

    def wait(self, timeout=None):
        for other in self.batch:
            if hasattr(other, "post"):   # a bounded receive
                other.guard._settle(other)
        return self.handle.wait()

    def is_completed(self) -> bool:
        return self.handle.is_completed()


class _SendAfterReceives:
    """A send under ``p2p.bounded`` whose wait first posts this rank's pending receive
    buffers: raw gloo posts a receive's buffer when the receive is made, the bounded
    receive only when it is waited for, so without this two ranks that each post a
    send, then a receive, then wait for the send, would wait for each other."""

    def __init__(self, handle, guard):
        self.handle, self.guard = handle, guard

    def wait(self, timeout=None):
        if self.guard._unposted:
            self.guard._settle(self.guard._unposted[-1])
        return self.handle.wait()

    def is_completed(self) -> bool:
        return self.handle.is_completed()


class Recorder:
    """Log collectives and messages inside ``with recorder.active():``.

    ``log`` holds dicts: op, ranks (the group's global ranks), bytes, async, phase
    (what the caller set ``phase`` to), time (s). ``messages`` (``p2p=True``) holds
    the point-to-point ones, as ``p2p.bounded`` logs them, with batch markers.
    ``uncoalesced`` (under ``p2p.bounded``): a ``batch_isend_irecv`` posts its ops one
    by one through the bounded stand-ins and returns their handles.
    """

    def __init__(self, lazy: bool = False, p2p: bool = False, messages=None,
                 uncoalesced: bool = False, guard=None):
        self.lazy, self.p2p, self.uncoalesced = lazy, p2p, uncoalesced
        self.guard = guard   # p2p.bounded's: a blocking all-reduce is bounded too
        self.log, self.messages = [], [] if messages is None else messages
        self.phase = None
        self._pending: list[_Deferred] = []

    def _note(self, op, tensor, group, async_op) -> None:
        self.log.append({"op": op, "ranks": group_of(group),
                         "bytes": tensor.numel() * tensor.element_size(),
                         "async": bool(async_op), "phase": self.phase,
                         "time": time.perf_counter()})

    def _all_reduce(self, real):
        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            self._note("all_reduce", tensor, group, async_op)
            if not async_op and self.guard is not None:
                # A rank of the group that never calls it would hang the others: wait
                # as long as a bounded message, then say so, naming the group.
                work = real(tensor, op=op, group=group, async_op=True)
                self.guard.wait(work, f"in dist.all_reduce over ranks "
                                      f"{list(group_of(group))}, which a rank of that "
                                      f"group never called")
                return None
            if not (async_op and self.lazy):
                return real(tensor, op=op, group=group, async_op=async_op)
            deferred = _Deferred(self, lambda: real(tensor, op=op, group=group,
                                                    async_op=True))
            self._pending.append(deferred)
            return deferred
        return all_reduce

    def release(self, deferred: _Deferred) -> None:
        """Launch every held-back all-reduce up to ``deferred``, in order."""
        while deferred.work is None and self._pending:
            first = self._pending.pop(0)
            first.work = first.launch()

    def flush(self) -> int:
        """Launch and wait for every all-reduce the program never waited for; return
        how many there were (each is a bucket no one waited for)."""
        left = len(self._pending)
        while self._pending:
            last = self._pending[-1]
            self.release(last)
            last.work.wait()
        return left

    def _point_to_point(self, name, real):
        signature = inspect.signature(real)
        peer, group_peer = ("dst", "group_dst") if "send" in name else ("src",
                                                                       "group_src")

        def message(*args, **kwargs):
            call = signature.bind(*args, **kwargs)
            call.apply_defaults()
            tensor, said = call.arguments["tensor"], call.arguments
            self.messages.append({"op": name,
                                  "peer": said[peer] if said[peer] is not None
                                  else said[group_peer],
                                  "shape": tuple(tensor.shape),
                                  "bytes": tensor.numel() * tensor.element_size()})
            return real(*call.args, **call.kwargs)
        return message

    def _bounded_send(self, name, real):
        guard = real.__self__   # the p2p.bounded guard whose isend this is

        def send(*args, **kwargs):
            handle = _SendAfterReceives(guard.isend(*args, **kwargs), guard)
            if name == "send":   # blocking: wait here
                handle.wait()
                return None
            return handle
        return send

    def _batch(self, real):
        def batch_isend_irecv(p2p_op_list):
            self.messages.append({"op": "batch_begin"})
            try:
                if not self.uncoalesced:
                    return real(p2p_op_list)
                handles = [op.op(op.tensor, group=op.group, tag=op.tag,
                                 **{"group_dst" if op.op in (dist.isend, dist.send)
                                    else "group_src": op.group_peer})
                           for op in p2p_op_list]
                return [_Together(handle, handles) for handle in handles]
            finally:
                self.messages.append({"op": "batch_end"})
        return batch_isend_irecv

    @contextmanager
    def active(self):
        """Within the block, the replaced functions log (and hold back, if lazy)."""
        names = ["all_reduce", "batch_isend_irecv"] + (list(P2P) if self.p2p else [])
        names += ["send", "isend"] if self.uncoalesced else []
        real = {name: getattr(c10d, name) for name in names}
        stand_in = {"all_reduce": self._all_reduce(real["all_reduce"]),
                    "batch_isend_irecv": self._batch(real["batch_isend_irecv"])}
        stand_in.update({name: self._point_to_point(name, real[name])
                         for name in names if name in P2P and self.p2p})
        stand_in.update({name: self._bounded_send(name, real[name])
                         for name in ("send", "isend") if self.uncoalesced})
        for module in (dist, c10d):
            for name in names:
                setattr(module, name, stand_in[name])
        try:
            yield self
        finally:
            for module in (dist, c10d):
                for name in names:
                    setattr(module, name, real[name])
