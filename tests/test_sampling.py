"""Invariant 2: sampled speculative output follows the target's law, and unit checks of the
acceptance rule on fixed probability tables."""

from __future__ import annotations

import math

import pytest
import torch

from specbatch.engine.sampling import accept_greedy, accept_sampled, warp


def test_warp_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = warp(logits, 1.0, 0.8)
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(warp(logits, 1.0, 0.81), torch.tensor([[0.5, 0.3, 0.15, 0.0]], dtype=torch.float64) / 0.95)


def test_warp_temperature_sharpens():
    logits = torch.tensor([[1.0, 0.0]])
    assert warp(logits, 0.5, 1.0)[0, 0] > warp(logits, 1.0, 1.0)[0, 0]


def test_accept_greedy_counts_matching_prefix_and_returns_correction_or_bonus():
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert accept_greedy([5, 6], [5, 6, 4]) == (2, 4)
    assert accept_greedy([], [3]) == (0, 3)


def _empirical(draft_probs, target_probs, draft_token_law, trials=20000):
    """Sample a draft from q, run the rule, return the law of the first committed token."""
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(target_probs.shape[-1])
    for _ in range(trials):
        x = int(torch.multinomial(draft_token_law, 1, generator=generator))
        accepted, token = accept_sampled([x], draft_probs, target_probs, generator)
        counts[x if accepted else token] += 1
    return counts / trials


@pytest.mark.parametrize("point_mass", [False, True])
def test_accept_sampled_first_token_follows_target_law(point_mass):
    p = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    # n-gram style (point mass): always proposes token 0, q(x) = 1
    law = _empirical(None, p, torch.tensor([1.0, 0.0, 0.0])) if point_mass else _empirical(q, p, q[0])
    assert torch.allclose(law, p[0].float(), atol=0.015)


def chi_square_p_value(statistic: float, dof: int) -> float:
    """Upper tail of chi-square via the Wilson–Hilferty normal approximation."""
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def exact_law(model, prompt: list[int], num_tokens: int, temperature: float, top_p: float) -> torch.Tensor:
    """P(t1..tn) over all V^n continuations of `prompt`, flattened with t1 most significant."""
    vocab = model.config.vocab_size
    law = torch.ones(1, dtype=torch.float64)
    histories: list[list[int]] = [[]]
    with torch.no_grad():
        for _ in range(num_tokens):
            nexts = torch.stack([warp(model(torch.tensor([prompt + h], device=model.device)).logits[0, -1:],
                                      temperature, top_p)[0] for h in histories])  # [histories, vocab]
            law = (law[:, None] * nexts.cpu()).flatten()
            histories = [h + [t] for h in histories for t in range(vocab)]
    return law


def sample_outputs(small_vocab_pair, drafter: str, coupling: str, num_tokens: int, temperature: float,
                   top_p: float, trials: int, max_new_tokens: int | None = None, eagle=None, overrides=()):
    """`trials` seeded requests through the engine (max_new_tokens defaults to num_tokens), and the
    exact law of their first `num_tokens` tokens."""
    from engine_helpers import tiny_config

    from specbatch.core import Row, SamplingParams
    from specbatch.engine.build import build_hf_engine, load_models
    from specbatch.loop import MemoryRecorder

    config = tiny_config(small_vocab_pair, f"drafter.kind={drafter}", "scheduler.lookahead=fixed:3",
                         f"sampling.coupling={coupling}", "scheduler.max_batch_rows=64", f"models.eagle={eagle}",
                         *overrides)
    models = load_models(config)
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder)
    engine.stops.eos_token_ids = set()
    params = {"max_new_tokens": max_new_tokens or num_tokens, "temperature": temperature, "top_p": top_p}
    rows = [Row(f"s{i}", PROMPT, SamplingParams(**params, seed=i)) for i in range(trials)]
    for row in rows:
        engine.add(row)
    engine.run()
    law = exact_law(models.target, PROMPT, num_tokens, temperature, top_p)
    return rows, recorder, law, models.target.config.vocab_size


def assert_follows(rows, law: torch.Tensor, vocab: int, num_tokens: int) -> None:
    """Chi-square of the rows' first `num_tokens` tokens against the enumerated law (cells expecting
    fewer than 5 merged)."""
    counts = torch.zeros(len(law), dtype=torch.float64)
    for row in rows:
        counts[sum(t * vocab**i for i, t in enumerate(reversed(row.output_ids[:num_tokens])))] += 1
    expected = law * len(rows)
    big = expected >= 5
    assert counts[~big].sum() <= max(10.0, 3 * expected[~big].sum() + 10)  # rare cells stay rare
    merged_obs = torch.cat([counts[big], counts[~big].sum()[None]])
    merged_exp = torch.cat([expected[big], expected[~big].sum()[None]])
    statistic = float(((merged_obs - merged_exp) ** 2 / merged_exp.clamp(min=1e-9)).sum())
    assert chi_square_p_value(statistic, int(big.sum())) > 0.001


PROMPT = [1, 2, 3, 1, 2]  # repeats, so the n-gram drafter has something to propose


@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
@pytest.mark.parametrize("drafter,temperature,top_p", [("draft", 1.0, 1.0), ("draft", 0.7, 0.9), ("ngram", 1.0, 1.0),
                                                       ("suffix", 1.0, 1.0), ("eagle", 0.7, 0.9)])
def test_engine_samples_first_two_tokens_from_target_law(small_vocab_pair, small_vocab_eagle, drafter, temperature,
                                                         top_p, coupling):
    """Enumerate the exact law of the first two tokens (V² outcomes) and compare by chi-square."""
    rows, _, law, vocab = sample_outputs(small_vocab_pair, drafter, coupling, 2, temperature, top_p, 3000,
                                         eagle=small_vocab_eagle)
    assert_follows(rows, law, vocab, 2)
    assert sum(r.num_proposed for r in rows) > 0


@pytest.mark.slow  # 8 × ~13 s
@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
@pytest.mark.parametrize("drafter", ["draft", "ngram", "suffix", "eagle"])
def test_a_token_after_an_accepted_draft_follows_the_target_law(small_vocab_pair, small_vocab_eagle, drafter, coupling):
    """Requests of 4 tokens, so the round after the first token runs k = 2 and the rule also decides
    at draft position 1, after an accepted draft: the law of the first three tokens (V³ outcomes),
    the third of which that decision emits, is the target's."""
    rows, recorder, law, vocab = sample_outputs(small_vocab_pair, drafter, coupling, 3, 1.0, 1.0, 4000,
                                                max_new_tokens=4, eagle=small_vocab_eagle)
    assert_follows(rows, law, vocab, 3)
    reached_second = sum(1 for step in recorder.steps if step.num_proposed >= 2 and step.num_accepted >= 1)
    assert reached_second >= 200  # the rule judged draft position 1 this often


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_max_indices_are_argmax_on_ties_and_nan(dtype):
    """The engine's greedy verify reads `logits.max(-1).indices` (argmax's time on bfloat16 logits is
    4.7x max's): it must be argmax, the first maximum, through ties, infinities and NaN."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (37, 4099), generator=generator).to(dtype)  # many ties
    logits[torch.rand(logits.shape, generator=generator) < 0.001] = float("nan")
    logits[5, ::7] = float("inf")
    assert torch.equal(logits.max(dim=-1).indices, logits.argmax(dim=-1))
