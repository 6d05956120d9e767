"""Would this order of point-to-point messages deadlock on NCCL? A model, run on the
order two pipeline ranks really posted their messages.

Taught in: lab 10 (the pipeline's messages). On gloo a posted message goes as soon as
its partner is posted, in whatever order the ops were posted, so two ranks that each
post a send, then a receive, then wait, get through; a check on gloo cannot see the
danger by running. NCCL (as PyTorch drives it) runs a rank's messages to one peer on
one stream, in the order they were posted, and a send finishes only while the peer's
matching receive runs; the ops of one ``batch_isend_irecv`` run together.
``deadlock`` replays two ranks' logs under those rules and says where both would wait
forever. It is a hint next to a verdict, never the verdict: NCCL also lets small
messages through early.
"""

from dataclasses import dataclass

from labkit.messages import _

__all__ = ["Stall", "items", "deadlock", "describe"]

SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")


@dataclass(frozen=True)
class Stall:
    """Where two ranks would both wait: the index and the ops of each one's item."""

    first: int
    first_ops: tuple
    second: int
    second_ops: tuple


def items(log: list) -> list[list[str]]:
    """Group a rank's message log into what NCCL runs in turn: each op alone, or the
    ops of one ``batch_isend_irecv`` together. Each op becomes "send" or "recv"."""
    found, batch = [], None
    for entry in log:
        op = entry["op"]
        if op == "batch_begin":
            batch = []
        elif op == "batch_end":
            if batch:
                found.append(batch)
            batch = None
        elif op in SENDS + RECEIVES:
            kind = "send" if op in SENDS else "recv"
            (batch.append(kind) if batch is not None else found.append([kind]))
    return found


def _numbered(sequence: list[list[str]]) -> list[list[tuple]]:
    """Number each rank's sends and receives in order: ("send", 3) is its 4th send."""
    counts, out = {"send": 0, "recv": 0}, []
    for item in sequence:
        numbered = []
        for kind in item:
            numbered.append((kind, counts[kind]))
            counts[kind] += 1
        out.append(numbered)
    return out


def deadlock(first: list, second: list) -> Stall | None:
    """Replay two ranks' items (``items`` of each log, messages between just the two);
    return where both would wait forever, or None.

    The k-th send of one rank matches the k-th receive of the other. An op finishes
    when its match is in the other rank's current item; an item is done when all its
    ops are; then the rank moves on to its next item.
    """
    logs = [_numbered(first), _numbered(second)]
    at, done = [0, 0], [set(), set()]
    while at[0] < len(logs[0]) or at[1] < len(logs[1]):
        moved = False
        current = [set(logs[r][at[r]]) if at[r] < len(logs[r]) else set()
                   for r in (0, 1)]
        for r in (0, 1):
            other = 1 - r
            for kind, k in current[r] - done[r]:
                match = ("recv" if kind == "send" else "send", k)
                if match in current[other]:
                    done[r].add((kind, k))
                    done[other].add(match)
                    moved = True
        for r in (0, 1):
            if current[r] and current[r] <= done[r]:
                at[r] += 1
                moved = True
        if not moved:
            if not current[0] or not current[1]:
                return None   # one rank has nothing left: a count mismatch, not NCCL's
            return Stall(at[0], tuple(logs[0][at[0]]), at[1], tuple(logs[1][at[1]]))
    return None


def describe(stall: Stall, ranks: tuple) -> str:
    """Say, in the learner's language, where the two ranks would wait."""
    def ops(numbered):
        return " + ".join(f"{kind} #{k + 1}" for kind, k in numbered)
    return _("On NCCL this order would deadlock: rank {a} would wait in its {a_ops} "
             "while rank {b} waits in its {b_ops}. NCCL runs a rank's messages to one "
             "peer in the order they were posted, and a send waits for the peer's "
             "matching receive, which here comes after the peer's own send. Post a "
             "send and the receive it is paired with in one dist.batch_isend_irecv, "
             "or let one rank of each pair post its receive first (the later stage, "
             "say). gloo runs each posted message as soon as its partner is posted, "
             "so this run got through.").format(a=ranks[0], a_ops=ops(stall.first_ops),
                                                b=ranks[1], b_ops=ops(stall.second_ops))
