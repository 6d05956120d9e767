"""Lab 10's GPT, its corpus and its one-process reference: what the checks stand on."""

import pytest
import torch

from labkit.labs.capstone import corpus, gpt, layout, planner, reference

TINY = gpt.GPTConfig(context=16, width=32, num_layers=2, num_heads=4)


def test_build_is_the_same_everywhere_and_leaves_the_random_state():
    """Does build() give equal weights twice, without touching the global RNG?"""
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = gpt.build(TINY), gpt.build(TINY)
    assert torch.rand(1) == before
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_biases_start_small_and_random_norms_at_one():
    """Do linear biases start nonzero (a misplaced bias shows) and norms at (1, 0)?"""
    model = gpt.build(TINY)
    assert model.blocks[0].attn.out.bias.abs().max() > 0
    assert torch.equal(model.ln_f.weight, torch.ones(32))
    assert torch.equal(model.blocks[1].norm1.bias, torch.zeros(32))


def test_output_is_tied_to_the_token_embedding():
    """Is the output layer wte itself: one tensor, two uses, one gradient?"""
    model = gpt.build(TINY)
    names = [name for name, _p in model.named_parameters()]
    assert "wte.weight" in names and not any("head" in n for n in names)
    idx = torch.randint(0, 256, (2, 8))
    logits = model(idx)
    assert logits.shape == (2, 8, 256)
    logits[:, :, 7].sum().backward()   # byte 7 need not be in the input
    assert model.wte.weight.grad[7].abs().sum() > 0


def test_attention_is_causal():
    """Does a change of the last token leave every earlier position's logits alone?"""
    model = gpt.build(TINY)
    idx = torch.randint(0, 256, (1, 10))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % 256
    assert torch.allclose(model(idx)[0, :-1], model(changed)[0, :-1], atol=1e-6)
    assert not torch.allclose(model(idx)[0, -1], model(changed)[0, -1])


def test_generate_continues_the_prompt_reproducibly():
    """Does generate return the prompt plus n bytes, the same for the same seed?"""
    model = gpt.build(TINY)
    prompt = list(b"def ")
    out = gpt.generate(model, prompt, 20, seed=1)
    assert out[:4] == prompt and len(out) == 24
    assert gpt.generate(model, prompt, 20, seed=1) == out
    with pytest.raises(ValueError, match="at least one token"):
        gpt.generate(model, [], 5)


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 30, "num_heads": 4}, "does not split into num_heads"),
    ({"num_layers": 0}, "num_layers must be a positive integer"),
])
def test_bad_config_is_refused(kwargs, message):
    """Does a shape that cannot work get a clear error?"""
    with pytest.raises(ValueError, match=message):
        gpt.GPTConfig(**kwargs)


def test_corpus_is_the_language_reference_as_bytes():
    """Are the tokens the text's UTF-8 bytes (decode gives the text back)?"""
    ids = corpus.tokens()
    text = corpus.text()
    assert len(ids) > 400_000 and ids.max() < corpus.VOCAB_SIZE
    assert corpus.decode(ids[:2000]) == text.encode()[:2000].decode("utf-8", "replace")
    assert "The \"assert\" statement" in text


def test_batches_are_seeded_windows_of_the_text():
    """Are batches (steps, B, T + 1) windows, the same for the same seed?"""
    ids = corpus.tokens()
    train, val = corpus.split(ids)
    assert len(train) + len(val) == len(ids) and len(val) == pytest.approx(
        0.1 * len(ids), abs=1)
    got = corpus.batches(train, 3, 4, 16, seed=5)
    assert got.shape == (3, 4, 17)
    assert torch.equal(got, corpus.batches(train, 3, 4, 16, seed=5))
    start = next(i for i in range(len(train)) if torch.equal(train[i:i + 17], got[0, 0]))
    assert start >= 0


@pytest.mark.parametrize("call, message", [
    (lambda: corpus.split(torch.arange(10), 1.5), "val_fraction"),
    (lambda: corpus.batches(torch.arange(10), 1, 1, 16), "cannot make windows"),
])
def test_corpus_refuses_bad_input(call, message):
    """Do impossible splits and windows get a clear error?"""
    with pytest.raises(ValueError, match=message):
        call()


def _cfg(**kwargs):
    return layout.RunConfig(model=TINY, bucket_bytes=2**13, **kwargs)


def test_reference_trains_and_keeps_every_step():
    """Does the one-process run lower the loss and keep the weights of every step?"""
    batches = corpus.batches(corpus.split(corpus.tokens())[0], 4, 8, 16)
    run = reference.train(_cfg(), batches)
    assert len(run["losses"]) == len(run["weights"]) == 4
    assert run["losses"][-1] < run["losses"][0]
    assert not torch.equal(run["weights"][0]["wte.weight"], run["start"]["wte.weight"])


def test_gradients_twice_as_large_train_like_twice_the_learning_rate():
    """With SGD (momentum, no decay), is k x the gradient exactly k x the lr (how the
    checks recognise gradients summed, not averaged)?"""
    batches = corpus.batches(corpus.split(corpus.tokens())[0], 3, 8, 16)
    cfg = _cfg()
    model = gpt.build(cfg.model)
    optimizer = reference.make_optimizer(model.parameters(), cfg)
    for window in batches:
        optimizer.zero_grad()
        (2 * reference.step_loss(model, window)).backward()
        optimizer.step()
    doubled = reference.train(cfg, batches, lr_scale=2.0)["weights"][-1]
    gap = max((p.detach() - doubled[n]).abs().max().item()
              for n, p in model.named_parameters())
    assert gap < reference.TOLERANCE / 10


def test_another_summation_order_stays_far_inside_the_tolerance():
    """Is the gradient of two half batches, averaged, within 1e-6 of the whole batch's
    (float rounding), 10x inside the checks' tolerance?"""
    window = corpus.batches(corpus.split(corpus.tokens())[0], 1, 8, 16)[0]
    cfg = _cfg()
    whole = reference.gradients(cfg, window)["grads"]
    halves = [reference.gradients(cfg, part)["grads"] for part in window.chunk(2)]
    gap = max(((a + b) / 2 - whole[name]).abs().max().item()
              for name, a, b in zip(whole, halves[0].values(), halves[1].values()))
    assert 0 < gap < reference.TOLERANCE / 10


def test_run_config_refuses_an_impossible_mesh():
    """Do more stages than blocks, or heads that do not split, get a clear error that
    names the fix?"""
    with pytest.raises(ValueError, match="2 blocks cannot fill pp = 3 pipeline "
                                         "stages(.|\n)*Use pp <= 2"):
        _cfg(pp=3)
    with pytest.raises(ValueError, match="heads do not split over tp = 3"):
        _cfg(tp=3)
    with pytest.raises(ValueError, match="'sgd' or 'adamw'"):
        _cfg(optimizer="adam")


def test_uneven_stages_take_the_planners_rule():
    """Stages of unequal size: the first L % pp stages hold one block more, as the
    planner (exercise 10.5) counts them, and together they hold every block once."""
    for layers, pp in [(3, 2), (5, 4), (4, 3), (4, 4), (7, 3)]:
        cfg = layout.RunConfig(model=gpt.GPTConfig(num_layers=layers), dp=1, tp=1, pp=pp)
        stages = [list(layout.stage_blocks(cfg, s)) for s in range(pp)]
        assert sum(stages, []) == list(range(layers))
        assert [len(s) for s in stages] == planner.layers_per_stage(layers, pp)
