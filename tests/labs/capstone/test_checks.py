"""Lab 10's checks: each passes on the notebook's solution and on correct solutions in
other idioms, fails on the stub with "not done yet", and names each classic mistake.

Each test writes the modules the %%writefile cells of solutions/10_capstone.ipynb
write into a temporary folder, changes one on purpose, and runs a check there (4 or
1-8 gloo ranks). The five classic mistakes of the issue are each shown to the 3-D
check (train_3d), whose hint must name them from the numbers alone. None of these
mistakes deadlocks, so the checks keep their 15 s bound on a message: a loaded
machine must not turn a slow message into a "stuck" verdict.
"""

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.checks import ExerciseFailed
from labkit.labs.capstone import checks
from notebook_cells import solution_folder, write_program

NOTEBOOK = "10_capstone.ipynb"
MODULES = ("tp_gpt.py", "dp_buckets.py", "pp_gpt.py", "gpt3d.py", "zero1_clip.py")
CHECKS = {"tp_gpt.py": checks.tp_block, "dp_buckets.py": checks.dp_buckets,
          "pp_gpt.py": checks.pipeline, "gpt3d.py": checks.train_3d,
          "zero1_clip.py": checks.zero1_clip}
ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder holding every solved module; the checks run from it."""
    return solution_folder(tmp_path, monkeypatch, NOTEBOOK, MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_check_passes_on_the_solution(folder, capsys, module):
    """Does each check pass on the notebook's solution?"""
    CHECKS[module](str(folder / module))
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("module", MODULES)
def test_check_says_not_done_on_the_stub(folder, module):
    """Does each check fail on the learner's stub with "not done yet" and its way past?"""
    path = write_program(folder, NOTEBOOK, module, source_folder="labs")
    with pytest.raises(ExerciseFailed, match="not done yet(.|\n)*use_reference"):
        CHECKS[module](str(path))


def test_a_stub_in_another_module_is_named(folder):
    """Does train_3d name the piece whose stub stopped it, with that piece's way past?"""
    write_program(folder, NOTEBOOK, "dp_buckets.py", source_folder="labs")
    with pytest.raises(ExerciseFailed, match=r'dp_buckets.py is not done yet(.|\n)*'
                       r'use_reference\("dp_buckets.py"\)'):
        checks.train_3d(str(folder / "gpt3d.py"))


def test_the_layouts_run_in_waves_no_larger_than_the_whole_mesh():
    """Does every layout run exactly once, in waves of at most the mesh's 8 ranks?"""
    layouts = checks.LAYOUTS
    waves = checks.waves(layouts, checks.CHECK.world_size)
    assert sorted(cfg.name for wave in waves for cfg in wave) == sorted(
        cfg.name for cfg in layouts)
    assert [sum(cfg.world_size for cfg in wave) for wave in waves] == [8, 8, 8, 6]


def test_a_layout_that_raises_is_named(folder):
    """When the Trainer raises on some layouts only, does the verdict say which one,
    although the layouts run several at a time?"""
    path = folder / "gpt3d.py"
    source = path.read_text()
    raising = ("        self.cfg = cfg\n        if cfg.tp == 1 and cfg.pp == 2:\n"
               "            raise ValueError('no pipeline without TP')\n")
    path.write_text(source.replace("        self.cfg = cfg\n", raising, 1))
    with pytest.raises(ExerciseFailed, match=r"train_3d \(dp=\d tp=1 pp=2\): rank \d "
                                             r"raised ValueError: no pipeline"):
        checks.train_3d(str(path))


WAIT_THEN_STEP = """        self.buckets.wait()                                   # every bucket, then:
        sync_tied(self.stage, self.tied_group)                # first + last stage
        self.optimizer.step()"""
TP_PROJECTION = """        partial = F.linear(y, self.out.weight)               # (B, T, C): a partial sum
        return ReduceFromParallel.apply(partial, self.group) + self.out.bias"""

CLASSIC = {   # the five classic mistakes: (module, replacements, the hint)
    "TP all-reduce in the wrong place (before attention's projection)": (
        "tp_gpt.py", [(TP_PROJECTION, """        y = ReduceFromParallel.apply(y, self.group)
        return F.linear(y, self.out.weight) + self.out.bias""")],
        r"Every layout with tp > 1 fails(.|\n)*tp_block"),
    "DP gradients summed, not averaged": (
        "dp_buckets.py", [("            flat /= self.size                 # the sum over "
                           "the group -> the mean\n", "")],
        r"dp = 2 x one process's: summed over the DP group(.|\n)*Every layout with dp > 1"),
    "a stage's loss not divided by the micro-batch count": (
        "pp_gpt.py", [("out = gpt.loss_of(out, targets) / m ",
                       "out = gpt.loss_of(out, targets) ")],
        r"and so is every gradient(.|\n)*Divide each micro-batch's loss by m = 4"),
    "position embeddings on the wrong pipeline stage": (
        "pp_gpt.py", [("        self.wpe = model.wpe if self.first else None\n",
                       "        self.wpe = model.wpe\n"),
                      ("            x = self.wte(x) + self.wpe(positions)",
                       "            x = self.wte(x)\n"
                       "        x = x + self.wpe(torch.arange(x.shape[1], device=x.device))")],
        r"holds the position embedding wpe(.|\n)*Every layout with pp > 1"),
    "a bucket waited after the optimizer step": (
        "gpt3d.py", [(WAIT_THEN_STEP, """        sync_tied(self.stage, self.tied_group)
        self.optimizer.step()
        self.buckets.wait()""")],
        r"replicas of one shard now hold different weights(.|\n)*BEFORE optimizer.step"),
}


@pytest.mark.parametrize("mistake", CLASSIC)
def test_the_3d_check_names_each_classic_mistake(folder, mistake):
    """Does train_3d reject each classic mistake with the hint the numbers point to?"""
    module, replace, hint = CLASSIC[mistake]
    write_program(folder, NOTEBOOK, module, replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.train_3d(str(folder / "gpt3d.py"))


PIECE_MISTAKES = {   # mistakes each piece's own check names
    "TP: an all-reduce before the projection": (
        "tp_gpt.py", CLASSIC["TP all-reduce in the wrong place (before attention's "
                             "projection)"][1], r"summed a \(B, T, 16\) tensor"),
    "TP: all-reduced over the whole world": (
        "tp_gpt.py", [("        dist.all_reduce(total, group=group)       # the sum of the "
                       "partial sums", "        dist.all_reduce(total)")],
        r"over ranks \[0, 1, 2, 3\], not this rank's TP group"),
    "TP: f's backward passes the gradient on": (
        "tp_gpt.py", [("        dist.all_reduce(grad, group=ctx.group)    # every rank's "
                       "heads used x\n", "")], "no all-reduce ran in backward"),
    "TP: the biases added before the sum": (
        "tp_gpt.py", [(TP_PROJECTION, """        partial = F.linear(y, self.out.weight, self.out.bias)
        return ReduceFromParallel.apply(partial, self.group)"""),
                      ("        partial = F.linear(hidden, self.fc2.weight)\n"
                       "        return ReduceFromParallel.apply(partial, self.group) + "
                       "self.fc2.bias",
                       "        partial = F.linear(hidden, self.fc2.weight, self.fc2.bias)\n"
                       "        return ReduceFromParallel.apply(partial, self.group)")],
        "counted 2 times"),
    "DP: summed, not averaged": (
        "dp_buckets.py", CLASSIC["DP gradients summed, not averaged"][1],
        "2 x the mean: the sum over the DP group"),
    "DP: every bucket launched in wait(), after backward": (
        "dp_buckets.py", [("        if self.missing[index] == 0:       # the bucket's last "
                           "gradient: send it now\n",
                           "        if False:\n"),
                          ("        for work, flat, index in self.in_flight:\n",
                           "        for index, bucket in enumerate(self.buckets):\n"
                           "            flat = torch.cat([p.grad.flatten() for p in bucket])\n"
                           "            work = dist.all_reduce(flat, group=self.group, "
                           "async_op=True)\n")],
        "0 of 13 all-reduces started during backward"),
    "PP: the tied embedding's gradient not summed": (
        "pp_gpt.py", [("        dist.all_reduce(stage.wte.weight.grad, group=group)",
                       "        pass")], "copies of the tied wte disagree"),
    "PP: the loss not divided by m": (
        "pp_gpt.py", CLASSIC["a stage's loss not divided by the micro-batch count"][1],
        "added up, not averaged"),
}


@pytest.mark.parametrize("mistake", PIECE_MISTAKES)
def test_each_piece_check_names_its_mistakes(folder, mistake):
    """Does the piece's own check name each mistake, from the numbers and messages?"""
    module, replace, hint = PIECE_MISTAKES[mistake]
    path = write_program(folder, NOTEBOOK, module, replace)
    with pytest.raises(ExerciseFailed, match=hint):
        CHECKS[module](str(path))


def test_gpipe_order_is_not_1f1b(folder):
    """Right numbers with every forward before the first backward: named fill-drain."""
    path = write_program(folder, NOTEBOOK, "pp_gpt.py", [
        ("    warmup = min(size - rank - 1, m)", "    warmup = m"),
        ("        out = forward(i, x)\n        _exchange([(out.detach(), after)], [], group)",
         "        out = forward(i, x)\n        if not stage.last:\n"
         "            _exchange([(out.detach(), after)], [], group)")])
    with pytest.raises(ExerciseFailed, match="4 micro-batches' activations held at once"
                                             r"\): that is fill-drain"):
        checks.pipeline(str(path))


UNSAFE = ("""    ops = ([dist.P2POp(dist.isend, t, group=group, group_peer=p) for t, p in sends]
           + [dist.P2POp(dist.irecv, b, group=group, group_peer=p) for b, p in receives])
    if ops:                                   # one batch: NCCL runs its ops together
        for work in dist.batch_isend_irecv(ops):
            work.wait()""", """    works = [dist.isend(t, group=group, group_dst=p) for t, p in sends]
    works += [dist.irecv(b, group=group, group_src=p) for b, p in receives]
    for work in works:
        work.wait()""")


def test_an_order_that_deadlocks_on_nccl_passes_with_a_warning(folder, capsys):
    """Sends posted before their paired receives on both ranks: right on gloo, so it
    passes, and the replay under NCCL's rules warns of the deadlock."""
    path = write_program(folder, NOTEBOOK, "pp_gpt.py", [UNSAFE])
    checks.pipeline(str(path))
    out = capsys.readouterr().out
    assert "✅" in out and "On NCCL this order would deadlock" in out


def test_the_solution_gets_no_nccl_warning(folder, capsys):
    """Does the batched solution pass without the deadlock warning?"""
    checks.pipeline(str(folder / "pp_gpt.py"))
    assert "deadlock" not in capsys.readouterr().out


CASES = [   # (alternative, the module it replaces, also run the 3-D check with it?)
    ("lab10_gpt3d_new_groups.py", "gpt3d.py", True),      # new_group, not DeviceMesh
    ("lab10_pp_gpt_ordered.py", "pp_gpt.py", True),       # receives posted first
    ("lab10_dp_buckets_futures.py", "dp_buckets.py", False),
    ("lab10_tp_gpt_megatron.py", "tp_gpt.py", False),
    ("lab10_tp_gpt_dtensor.py", "tp_gpt.py", True),       # parallelize_module, DTensors
    ("lab10_zero1_clip_flat.py", "zero1_clip.py", False),  # contiguous runs, flat sends
]


@pytest.mark.parametrize("alternative, module, with_3d", CASES, ids=[c[0] for c in CASES])
def test_alternative_solution_passes(folder, capsys, alternative, module, with_3d):
    """Does a correct solution in another idiom (hand-made new_groups; plain isend and
    irecv with the later stage receiving first; futures and torch's flatten helpers;
    Megatron's mappings; torch's DTensor TP, whose gradients the buckets see as
    DTensors) pass its own check, and the 3-D one where it composes differently, with
    no NCCL warning?"""
    shutil.copy(ALTERNATIVES / alternative, folder / module)
    CHECKS[module](str(folder / module))
    if with_3d and module != "gpt3d.py":
        checks.train_3d(str(folder / "gpt3d.py"))
    out = capsys.readouterr().out
    assert out.count("✅") == (2 if with_3d and module != "gpt3d.py" else 1)
    assert "deadlock" not in out


# Issue 38's mistakes: each runs, and equal numbers alone would not catch the first
# three; every one is rejected with the hint that names it.
STEP_SHARE = "        mine = tokens.chunk(cfg.dp)[self.dp_rank]             # this replica's share"
NO_WARMUP = [("    warmup = min(size - rank - 1, m)", "    warmup = 0")]
MORE_MISTAKES = {
    "3-D: every DP replica trains on the whole batch": (
        "gpt3d.py", [(STEP_SHARE, "        mine = tokens")],
        checks.train_3d, r"every replica read the whole batch"),
    "3-D: every DP replica trains on the first share": (
        "gpt3d.py", [(STEP_SHARE, "        mine = tokens.chunk(cfg.dp)[0]")],
        checks.train_3d, r"DP ranks 0 and 1 both trained on sequence"),
    "3-D: whole windows fed, not w[:, :-1]": (
        "gpt3d.py", [("microbatches = [(w[:, :-1], w[:, 1:]) for w in "
                      "mine.chunk(cfg.num_microbatches)]",
                      "microbatches = [(w, w[:, 1:]) for w in "
                      "mine.chunk(cfg.num_microbatches)]")],
        checks.train_3d, r"inputs are w\[:, :-1\]"),
    "3-D: the loss reported divided by m again": (
        "gpt3d.py", [("        return mean.item() / cfg.dp",
                      "        return mean.item() / cfg.dp / cfg.num_microbatches")],
        checks.train_3d, r"1/4 of the batch's(.|\n)*divided by m again"),
    "3-D: the tied embedding synced over the whole pipeline": (
        "gpt3d.py", [("        sync_tied(self.stage, self.tied_group)",
                      "        sync_tied(self.stage, self.groups[\"pp\"])")],
        checks.train_3d, r"dp=1 tp=1 pp=3(.|\n)*never joined the all-reduce(.|\n)*"
                         r"first and last stage"),
    "3-D: 1F1B with no warm-up": (
        "pp_gpt.py", NO_WARMUP, checks.train_3d, r"too few warm-up forwards"),
    "PP: 1F1B with no warm-up": (
        "pp_gpt.py", NO_WARMUP, checks.pipeline,
        r"right numbers, but on rank 0 stage 0 of 2 ran F0 B0 F1 B1(.|\n)*"
        r"too few warm-up forwards"),
    "PP: the received activation not marked requires_grad_()": (
        "pp_gpt.py", [("x = inputs if stage.first else received.requires_grad_()",
                       "x = inputs if stage.first else received")],
        checks.pipeline, r"requires_grad_\(\) on the received buffer"),
    "PP: the tied gradients averaged, not summed": (
        "pp_gpt.py", [("        dist.all_reduce(stage.wte.weight.grad, group=group)",
                       "        dist.all_reduce(stage.wte.weight.grad, group=group)\n"
                       "        stage.wte.weight.grad /= 2")],
        checks.pipeline, r"must be ADDED"),
    "PP: the tied gradient broadcast from the first stage": (
        "pp_gpt.py", [("        dist.all_reduce(stage.wte.weight.grad, group=group)",
                       "        dist.broadcast(stage.wte.weight.grad, group=group, "
                       "group_src=0)")],
        checks.pipeline, r"must be ADDED"),
    "DP: a blocking all-reduce in the hook": (
        "dp_buckets.py", [("            work = dist.all_reduce(flat, group=self.group, "
                           "async_op=True)",
                           "            work = dist.all_reduce(flat, group=self.group)"),
                          ("            work.wait()\n", "")],
        checks.dp_buckets, r"ran in backward but blocking \(async_op=False\)"),
    "TP: the output bias added on one rank only, before the sum": (
        "tp_gpt.py", [(TP_PROJECTION, """        partial = F.linear(y, self.out.weight)
        if dist.get_rank(self.group) == 0:
            partial = partial + self.out.bias
        return ReduceFromParallel.apply(partial, self.group)""")],
        checks.tp_block, r"attn.out.bias got no gradient(.|\n)*bias added on one rank"),
    "TP: the scale of the rank's width, not the head's": (
        "tp_gpt.py", [("        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                       "        y = F.scaled_dot_product_attention(\n"
                       "            q, k, v, is_causal=True,\n"
                       "            scale=(self.num_heads * self.head_dim) ** -0.5)")],
        checks.tp_block, r"scaled by 1/sqrt\(16\), this rank's width"),
    "TP: no causal mask": (
        "tp_gpt.py", [("        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                       "        y = F.scaled_dot_product_attention(q, k, v)")],
        checks.tp_block, r"the causal mask is missing"),
}


@pytest.mark.parametrize("mistake", MORE_MISTAKES)
def test_each_classic_mistake_is_named(folder, mistake):
    """Is each of these mistakes rejected, by the check that sees it, with its hint?"""
    module, replace, check, hint = MORE_MISTAKES[mistake]
    write_program(folder, NOTEBOOK, module, replace)
    target = "gpt3d.py" if check is checks.train_3d else module
    with pytest.raises(ExerciseFailed, match=hint):
        check(str(folder / target))


def test_four_uneven_stages_are_exact_on_8_ranks(folder, capsys):
    """The solution on a 2 x 1 x 4 mesh of a 5-block GPT (stages of 2, 1, 1 and 1
    blocks, two middle stages without wte): every loss and weight equals one process,
    at every step, 1F1B's order on every stage."""
    deep = replace(checks.CHECK, model=replace(checks.CHECK.model, num_layers=5),
                   dp=2, tp=1, pp=4)
    checks.train_3d(str(folder / "gpt3d.py"), layouts=[deep])
    assert "all 1 layouts equal one process" in capsys.readouterr().out


@pytest.mark.parametrize("layout, refusal", [
    (dict(dp=4, tp=1, pp=2), r"does not split into dp x m = 16 equal micro-batches"),
    (dict(dp=2, tp=2, pp=3), r"needs 12 ranks; the check runs at most 8"),
])
def test_a_layout_the_check_cannot_run_is_refused(folder, layout, refusal):
    """Is a layout the check cannot run refused at once, saying why and what to do?"""
    with pytest.raises(ExerciseFailed, match=refusal):
        checks.train_3d(str(folder / "gpt3d.py"), layouts=[replace(checks.CHECK, **layout)])


ZERO1_NORM = "        if param.shape != whole[name]:              # a TP shard: its pieces add up"
ZERO1_MISTAKES = {   # exercise 10.7: each rejected with the hint that names it
    "the whole tensors counted on every TP rank": (
        [(ZERO1_NORM, "        if True:")], r"dp=2 tp=2 pp=2(.|\n)*holds whole(.|\n)*2 times"),
    "the tied wte counted twice": (
        [("            continue                                # the tied copy: counted "
          "once", "            pass")], r"counted the tied wte twice"),
    "the norm summed over the DP group": (
        [("    return total.sqrt().item()",
          "    dist.all_reduce(total, group=groups[\"dp\"])\n    return total.sqrt().item()")],
        r"summed over the DP group too"),
    "the shares never sent": (
        [("        for param, owner in zip(self.params, self.owner):\n"
          "            dist.broadcast(param.data, group=self.groups[\"dp\"], "
          "group_src=owner)", "        pass")], r"the shares were not sent"),
    "every rank keeps every state": (
        [("        mine = [p for p, owner in zip(self.params, self.owner) if owner == me]",
          "        mine = self.params")], r"the whole of its stage's, as without ZeRO-1"),
}


@pytest.mark.parametrize("mistake", ZERO1_MISTAKES)
def test_zero1_clip_names_each_mistake(folder, mistake):
    """Is each classic mistake of ZeRO-1 and global-norm clipping rejected with its
    hint, from the norms, the weights and the bytes the ranks hold?"""
    replace_, hint = ZERO1_MISTAKES[mistake]
    path = write_program(folder, NOTEBOOK, "zero1_clip.py", replace_)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.zero1_clip(str(path))


def test_zero1_clip_shows_the_states_halved(folder, capsys):
    """The solution keeps about half the optimizer states on dp = 2, said beside lab
    07's 1/dp."""
    checks.zero1_clip(str(folder / "zero1_clip.py"))
    out = capsys.readouterr().out
    share = int(re.search(r"(\d+)% of the", out).group(1))
    assert 40 <= share <= 60 and "1/dp = 50%" in out
