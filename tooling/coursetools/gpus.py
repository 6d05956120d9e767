"""What a room needs in GPUs: per lab, and per track (INSTRUCTORS.md's GPU column).

Taught in: nowhere (instructor tooling). Every lab runs on CPU ranks (gloo). NCCL takes
one GPU per rank, so a learner sees it only with as many GPUs as the lab's largest
job has ranks: each solution states that number in
``metadata.labkit.gpus_per_learner`` and the reason in ``gpus_why``.
"""

__all__ = ["ADVICE", "advice", "table"]

# The wording; coursetools.guides holds the other languages' ("why" translates each
# lab's metadata.labkit.gpus_why, by the English).
ADVICE = {
    "none": "none needed; 1 runs every cell on its GPU",
    "need": "none needed (gloo, CPU ranks). To see NCCL in every multi-rank cell: "
            "{need}. With 1 GPU, no NCCL at all (one GPU per rank)",
    "group": "{gpus} for {labs}", "groups": "; ",
    "header": "| lab | GPUs per learner for every cell on GPUs | because |",
    "why": {},
}


def _gpus(nb) -> int:
    return nb.metadata.get("labkit", {}).get("gpus_per_learner", 0)


def advice(labs: list[str], notebooks: dict, words: dict = ADVICE) -> str:
    """What one learner needs for a track's labs to run every cell on GPUs, from
    each lab's ``metadata.labkit.gpus_per_learner`` (NCCL takes one GPU per rank)."""
    by_number = {name[:2]: _gpus(nb) for name, nb in notebooks.items()}
    groups = {}
    for number in sorted(set(labs)):
        if by_number[number] >= 2:
            groups.setdefault(by_number[number], []).append(number)
    if not groups:
        return words["none"]
    need = words["groups"].join(words["group"].format(gpus=n, labs=", ".join(group))
                                for n, group in sorted(groups.items()))
    return words["need"].format(need=need)


def table(notebooks: dict, words: dict = ADVICE) -> str:
    """Each lab's GPUs per learner for every cell on GPUs, and why."""
    rows = [words["header"], "|---|---|---|"]
    for name, nb in sorted(notebooks.items()):
        why = nb.metadata.get("labkit", {}).get("gpus_why", "—")
        rows.append(f"| {name[:2]} | {_gpus(nb)} | {words['why'].get(why, why)} |")
    return "\n".join(rows) + "\n"
