"""Lab 10's recorder: collectives and messages logged per group; held-back all-reduces."""

import torch
import torch.distributed as dist

from labkit import launch
from labkit.labs.capstone.recorder import Recorder


def lazy_all_reduce(ctx):
    """Rank worker: an async all-reduce is held back until waited for; flush sends the
    ones never waited for; a blocking one goes at once."""
    recorder = Recorder(lazy=True)
    found = {}
    with recorder.active():
        first = torch.ones(3)
        work = dist.all_reduce(first, async_op=True)
        found["held"] = (first.tolist(), work.is_completed())
        work.wait()
        found["after_wait"] = first.tolist()
        never = torch.ones(2)
        dist.all_reduce(never, async_op=True)
        found["flushed"] = recorder.flush()
        found["never"] = never.tolist()
        now = torch.ones(1)
        dist.all_reduce(now)
        found["blocking"] = now.item()
    found["log"] = [(e["op"], e["ranks"], e["bytes"], e["async"]) for e in recorder.log]
    return found


def test_async_all_reduces_wait_for_their_wait():
    """Held back until wait() (the tensor is unchanged before), flushed at the end,
    blocking ones at once, each logged with its group and bytes?"""
    got = launch.run(lazy_all_reduce, 2, timeout=60)[0]
    assert got["held"] == ([1.0, 1.0, 1.0], False)
    assert got["after_wait"] == [2.0, 2.0, 2.0] and got["never"] == [2.0, 2.0]
    assert got["flushed"] == 1 and got["blocking"] == 2.0
    assert got["log"] == [("all_reduce", (0, 1), 12, True), ("all_reduce", (0, 1), 8, True),
                          ("all_reduce", (0, 1), 4, False)]


def messages(ctx):
    """Rank worker: one batch_isend_irecv each way, logged with the batch's markers."""
    recorder = Recorder(p2p=True)
    peer = 1 - ctx.rank
    with recorder.active():
        out, buffer = torch.full((4,), float(ctx.rank)), torch.empty(4)
        ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, buffer, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return [(m["op"], m.get("peer"), m.get("bytes")) for m in recorder.messages], buffer[0].item()


def test_messages_are_logged_with_their_batch():
    """Does a batch_isend_irecv log its begin, each op with peer and bytes, its end?"""
    log, received = launch.run(messages, 2, timeout=60)[0]
    assert received == 1.0
    assert log == [("batch_begin", None, None), ("isend", 1, 16), ("irecv", 1, 16),
                   ("batch_end", None, None)]
