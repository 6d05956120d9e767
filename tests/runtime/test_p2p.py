"""p2p.bounded, the guard the lab 04 and 05 checks run the learner's messages in.

Every spelling of a message passes through it: blocking, isend/irecv, P2POp batches
in any order (the checks import the learner's module inside the guard, so ``from
torch.distributed import isend`` is guarded too). Data meets its own receive
whatever order the waits come in, and a wrong-shaped buffer is named.
"""

import pytest

from labkit import launch
from labkit.checks._programs import load_program

WORKER = '''
import torch
import torch.distributed as dist

from labkit import p2p


def facing(ctx, mib, rounds=4):
    """Both ranks send to each other at once, each send batched with its receive
    (1F1B's steady state on NCCL); return the first values received."""
    peer = 1 - ctx.rank
    mine = torch.full((mib * 2**18,), float(ctx.rank), device=ctx.device)
    got = torch.empty_like(mine)
    for _ in range(rounds):
        ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return got[:3].tolist()


def exchange(ctx, case):
    result = _exchange(ctx, case)
    dist.barrier()   # no rank leaves while the other still reads
    return result


def _exchange(ctx, case):
    log = []
    peer = 1 - ctx.rank
    mine = torch.full((3,), float(ctx.rank))
    with p2p.bounded(ctx.rank, 10.0, log) as guard:
        if case == "batch, receive listed first on both ranks":
            got = torch.empty(3)
            ops = [dist.P2POp(dist.irecv, got, peer),
                   dist.P2POp(dist.isend, mine, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            return got.tolist(), [entry["batch"] for entry in log]
        if case == "two receives waited in reverse":
            if ctx.rank == 0:
                dist.send(torch.ones(2), 1)
                dist.send(torch.full((4,), 2.0), 1)
                return None, len(log)
            a, b = torch.empty(2), torch.empty(4)
            wa, wb = dist.irecv(a, 0), dist.irecv(b, 0)
            wb.wait()
            wa.wait()
            return [a.tolist(), b.tolist()], len(log)
        if case == "wrong shape":
            if ctx.rank == 0:
                dist.isend(torch.ones(2, 3), 1).wait()
                return None, len(log)
            try:
                dist.recv(torch.empty(3, 2), src=0)
            except p2p.P2PError as err:
                guard.real["irecv"](torch.empty(2, 3), 0).wait()   # drain the data
                return str(err), len(log)
'''


@pytest.fixture
def worker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p2p_worker.py").write_text(WORKER)
    return load_program(tmp_path / "p2p_worker.py").exchange


def test_batch_isend_irecv_in_any_order(worker):
    """Both ranks list the receive first in one batch: no deadlock, right data, and
    both messages logged as batch 1 (what nccl_order reads as one NCCL group)?"""
    ranks = launch.run(worker, 2, args=("batch, receive listed first on both ranks",),
                       backend="gloo", timeout=60)
    assert [r[0] for r in ranks] == [[1.0] * 3, [0.0] * 3]
    assert [r[1] for r in ranks] == [[1, 1], [1, 1]]   # a receive, a send: batch 1


def test_receives_waited_out_of_order_get_their_own_data(worker):
    ranks = launch.run(worker, 2, args=("two receives waited in reverse",),
                       backend="gloo", timeout=60)
    assert ranks[1][0] == [[1.0, 1.0], [2.0] * 4]


def test_a_wrong_buffer_is_named(worker):
    ranks = launch.run(worker, 2, args=("wrong shape",), backend="gloo", timeout=60)
    want = "buffer of shape (3, 2) float32, but rank 0 sent (2, 3) float32"
    assert want in ranks[1][0]


def test_bounded_refuses_nccl(monkeypatch):
    """The guard's headers need message tags, which NCCL ignores: it says so."""
    import torch.distributed as dist

    from labkit import p2p

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ValueError, match="runs on gloo"):
        with p2p.bounded(0, 1.0, []):
            pass


@pytest.fixture
def facing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p2p_worker.py").write_text(WORKER)
    return load_program(tmp_path / "p2p_worker.py").facing


@pytest.mark.gpu(2)
def test_sends_facing_each_other_in_one_batch_complete_on_nccl(facing):
    """On 2 GPUs: 16 MiB sent both ways at once, each send in one batch with the
    receive (what lab 05's run_order does): no hang, each rank gets the other's?"""
    ranks = launch.run(facing, 2, args=(16,), backend="nccl", timeout=60)
    assert ranks == [[1.0] * 3, [0.0] * 3]


def test_sends_facing_each_other_in_one_batch_complete_on_gloo(facing):
    """The same exchange on gloo CPU ranks (small), as the checks run it."""
    ranks = launch.run(facing, 2, args=(1,), backend="gloo", timeout=60)
    assert ranks == [[1.0] * 3, [0.0] * 3]
