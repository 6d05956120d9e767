"""Lab 10's NCCL replay: which orders of pipeline messages deadlock under NCCL's rules."""

from labkit.labs.capstone import nccl_order


def log(*ops):
    """A rank's message log: strings are single ops, lists one batch_isend_irecv."""
    entries = []
    for op in ops:
        if isinstance(op, list):
            entries += [{"op": "batch_begin"}, *({"op": o} for o in op), {"op": "batch_end"}]
        else:
            entries.append({"op": op})
    return nccl_order.items(entries)


def test_items_group_a_batch_and_keep_single_ops_apart():
    """Is a batch one item and every other op an item of its own, as "send"/"recv"?"""
    assert log("isend", ["isend", "irecv"], "recv") == [["send"], ["send", "recv"],
                                                        ["recv"]]


def test_two_ranks_that_both_send_first_deadlock():
    """isend then irecv on both ranks: each send waits behind the other's send."""
    stall = nccl_order.deadlock(log("isend", "irecv"), log("isend", "irecv"))
    assert stall is not None and stall.first_ops == (("send", 0),)
    assert "would deadlock" in nccl_order.describe(stall, (0, 4))


def test_batched_or_receive_first_is_safe():
    """One batch each, or one side receiving first, completes under NCCL's rules."""
    assert nccl_order.deadlock(log(["isend", "irecv"]), log(["isend", "irecv"])) is None
    assert nccl_order.deadlock(log("isend", "irecv"), log("irecv", "isend")) is None


def test_megatron_1f1b_orders_are_safe_and_both_sides_preposting_is_not():
    """1F1B, p = 2, m = 4: Megatron's batched order completes; both ranks posting their
    receive before their send (a 'pre-posted' order on both sides) does not."""
    stage0 = log("isend", ["isend", "irecv"], ["isend", "irecv"], ["isend", "irecv"],
                 "irecv")
    stage1 = log("irecv", ["isend", "irecv"], ["isend", "irecv"], ["isend", "irecv"],
                 "isend")
    assert nccl_order.deadlock(stage0, stage1) is None
    both_receive_first = (log("isend", "irecv", "isend", "irecv", "isend"),
                          log("irecv", "irecv", "isend", "irecv", "isend"))
    assert nccl_order.deadlock(*both_receive_first) is not None


def test_counts_that_do_not_match_are_not_called_an_nccl_deadlock():
    """One rank with nothing left to post: a mismatch gloo hangs on too, not NCCL's."""
    assert nccl_order.deadlock(log("isend", "isend"), log("irecv")) is None
