"""Warping, the speculative acceptance rule, and per-request random generators.

The rule (Leviathan et al.; Chen et al.) keeps the target's output law exact. With p the target's
warped distribution and q the distribution the draft token x was *actually* sampled from, both at
the same history:
    accept x with probability min(1, p(x) / q(x));
    on rejection, sample the correction from norm(max(0, p - q));
    if every draft is accepted, sample the bonus token from p at the next position.
An n-gram proposal is a point mass, q(x) = 1. Greedy (temperature 0) is the limit where p and q
are point masses at their argmax: accept while the draft equals the target argmax.
"""

from __future__ import annotations

import hashlib

import torch


def request_generator(request_id: str, seed: int | None, job_seed: int,
                      device: torch.device | str = "cpu") -> torch.Generator:
    """A generator per request, on the device of the probabilities it samples from: batch-mates
    never draw from it. How many numbers a row draws still depends on its k, so text is reproducible
    only under the same schedule and device (see coupling.py)."""
    if seed is None:
        digest = hashlib.sha256(f"{job_seed}:{request_id}".encode()).digest()
        seed = int.from_bytes(digest[:8], "little") & (2**63 - 1)
    return torch.Generator(device=device).manual_seed(seed)


def warp(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sampling distribution after temperature and top-p (nucleus) warping.

    logits: [n, vocab] → probabilities [n, vocab] in float64 (ratios p/q stay accurate).
    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p.
    """
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [n, vocab]
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """probs: [vocab] → one token id."""
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_greedy(drafts: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """Greedy rule: accept while draft == target argmax. Returns (num_accepted, next_token).

    target_argmax has len(drafts) + 1 entries: position j verifies drafts[j]; the last is the bonus.
    """
    num_accepted = 0
    while num_accepted < len(drafts) and drafts[num_accepted] == target_argmax[num_accepted]:
        num_accepted += 1
    return num_accepted, target_argmax[num_accepted]


def accept_sampled(
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Exact rejection rule for sampled rows. Returns (num_accepted, correction or bonus token).

    drafts: k proposed tokens. draft_probs: [k, vocab], the warped q each draft was sampled from,
    or None for point-mass proposals (n-gram). target_probs: [k + 1, vocab], warped p.
    """
    for j, token in enumerate(drafts):
        p_x = float(target_probs[j, token])
        q_x = 1.0 if draft_probs is None else float(draft_probs[j, token])
        u = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
        if u * q_x < p_x:  # u < p(x) / q(x), without dividing by a tiny q
            continue
        if draft_probs is None:
            residual = target_probs[j].clone()
            residual[token] = 0.0
        else:
            residual = (target_probs[j] - draft_probs[j]).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: the rejection had probability ~0
            residual, total = target_probs[j], 1.0
        return j, sample(residual / total, generator)
    return len(drafts), sample(target_probs[len(drafts)], generator)
