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


@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
@pytest.mark.parametrize("drafter,temperature,top_p", [("draft", 1.0, 1.0), ("draft", 0.7, 0.9), ("ngram", 1.0, 1.0)])
def test_engine_samples_first_two_tokens_from_target_law(small_vocab_pair, drafter, temperature, top_p, coupling):
    """Enumerate the exact law of the first two tokens (V² outcomes) and compare by chi-square."""
    from engine_helpers import tiny_config

    from specbatch.core import Row, SamplingParams
    from specbatch.engine.build import build_hf_engine, load_models
    from specbatch.loop import MemoryRecorder

    config = tiny_config(small_vocab_pair, f"drafter.kind={drafter}", "scheduler.lookahead=fixed:3",
                         f"sampling.coupling={coupling}",
                         "scheduler.max_batch_rows=64")
    models = load_models(config)
    prompt = [1, 2, 3, 1, 2]  # repeats, so the n-gram drafter has something to propose
    vocab = models.target.config.vocab_size
    with torch.no_grad():
        first = warp(models.target(torch.tensor([prompt])).logits[0, -1:], temperature, top_p)[0]
        second = torch.stack([
            warp(models.target(torch.tensor([prompt + [t]])).logits[0, -1:], temperature, top_p)[0]
            for t in range(vocab)
        ])
    exact = (first[:, None] * second).flatten()  # P(t1, t2)
    engine = build_hf_engine(config, models, MemoryRecorder())
    engine.stops.eos_token_ids = set()
    trials = 3000
    rows = [Row(f"s{i}", prompt, SamplingParams(max_new_tokens=2, temperature=temperature, top_p=top_p, seed=i))
            for i in range(trials)]
    for row in rows:
        engine.add(row)
    engine.run()
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    for row in rows:
        counts[row.output_ids[0] * vocab + row.output_ids[1]] += 1
    expected = exact * trials
    big = expected >= 5
    assert counts[~big].sum() <= max(10.0, 3 * expected[~big].sum() + 10)  # rare cells stay rare
    merged_obs = torch.cat([counts[big], counts[~big].sum()[None]])
    merged_exp = torch.cat([expected[big], expected[~big].sum()[None]])
    statistic = float(((merged_obs - merged_exp) ** 2 / merged_exp.clamp(min=1e-9)).sum())
    assert chi_square_p_value(statistic, int(big.sum())) > 0.001
    assert sum(r.num_proposed for r in rows) > 0
