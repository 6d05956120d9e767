"""nccl_order: replaying recorded messages as NCCL runs them (one stream per pair of
ranks, a send ends when its receive runs, a batch is one group) finds the 1F1B hang
that gloo cannot show, and passes the orders that are safe."""

from labkit import nccl_order


def lone(op, peer, shape=(4, 8)):
    return {"op": op, "peer": peer, "shape": shape, "batch": None}


def batch(number, *ops):
    return [{"op": op, "peer": peer, "shape": (4, 8), "batch": number}
            for op, peer in ops]


def plain_1f1b(m):
    """run_order's messages for 1F1B on 2 ranks with one isend per send (the old
    lab 05 code): rank 0 F0 F1 B0 F2 B1 ..., rank 1 F0 B0 F1 B1 ..."""
    rank0 = [lone("isend", 1)]                       # F0
    for i in range(m - 1):
        rank0 += [lone("isend", 1), lone("recv", 1)]   # F(i+1), B(i)
    rank0 += [lone("recv", 1)]                       # B(m-1)
    rank1 = []
    for i in range(m):
        rank1 += [lone("recv", 0), lone("isend", 0)]   # F(i), B(i)
    return [rank0, rank1]


def batched_1f1b(m):
    """The same 1F1B with each send batched with the next action's receive."""
    rank0, number = [lone("isend", 1)], 0            # F0: the next is F1, no receive
    for i in range(m - 1):
        number += 1
        rank0 += batch(number, ("isend", 1), ("irecv", 1))   # F(i+1) with B(i)'s
    rank0 += [lone("irecv", 1)]                      # B(m-1)
    rank1, number = [lone("irecv", 0)], 0            # F0
    for i in range(m - 1):
        number += 1
        rank1 += batch(number, ("isend", 0), ("irecv", 0))   # B(i) with F(i+1)'s
    rank1 += [lone("isend", 0)]                      # B(m-1)
    return [rank0, rank1]


def test_plain_isends_facing_each_other_hang_on_nccl():
    """1F1B with lone isends: rank 0 waits in send a1, rank 1 in send g0?"""
    stuck = nccl_order.first_hang(plain_1f1b(4))
    assert [(s["rank"], s["op"], s["peer"]) for s in stuck] == [
        (0, "send", 1), (1, "send", 0)]
    assert all(s["matched"] for s in stuck)   # both are received, later: a hang
    text = nccl_order.describe(stuck)
    assert "rank 0 in a send to rank 1 of (4, 8)" in text
    assert "dist.batch_isend_irecv" in text


def test_each_send_batched_with_the_next_receive_completes():
    """The same order, each send in one batch with the next receive: no hang."""
    assert nccl_order.first_hang(batched_1f1b(8)) is None


def test_gpipe_with_plain_messages_completes():
    """GPipe on 2 ranks (all sends, then all receives, and the mirror): no hang."""
    m = 4
    rank0 = [lone("send", 1)] * m + [lone("recv", 1)] * m
    rank1 = [lone("recv", 0)] * m + [lone("send", 0)] * m
    assert nccl_order.first_hang([rank0, rank1]) is None


def test_three_stage_chain_with_plain_messages_completes():
    """A forward through 3 ranks: the middle one receives, then sends on."""
    logs = [[lone("send", 1)], [lone("recv", 0), lone("send", 2)], [lone("recv", 1)]]
    assert nccl_order.first_hang(logs) is None


def test_receive_first_on_both_ranks_hangs_too():
    """'Post the receive before the send' on BOTH ranks swaps the deadlock, not cure."""
    logs = [[lone("irecv", 1), lone("isend", 1)], [lone("irecv", 0), lone("isend", 0)]]
    stuck = nccl_order.first_hang(logs)
    assert [(s["rank"], s["op"]) for s in stuck] == [(0, "recv"), (1, "recv")]


def test_a_message_nobody_receives_is_unmatched():
    """A send with no receive anywhere: stuck, and said to be unmatched."""
    stuck = nccl_order.first_hang([[lone("isend", 1)], []])
    assert stuck == [{"rank": 0, "op": "send", "peer": 1, "shape": (4, 8),
                      "matched": False}]


def test_a_batch_to_two_peers_waits_for_both():
    """A middle rank batches a send to rank 2 with a receive from rank 0 that rank 0
    never sends: the batch is stuck on rank 0's side only, and said so."""
    logs = [[], batch(1, ("isend", 2), ("irecv", 0)), [lone("irecv", 1)]]
    stuck = nccl_order.first_hang(logs)
    assert [(s["rank"], s["op"], s["peer"], s["matched"]) for s in stuck] == [
        (1, "recv", 0, False)]
