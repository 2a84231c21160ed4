"""How a sampled row's draft and its verification share randomness: `sampling.coupling`.

Both couplings keep the target's output law exact; they differ in what else holds.

`rejection` (Leviathan et al.; Chen et al.): the drafter samples x from its warped q with the
request's generator, the target accepts x with probability min(1, p(x)/q(x)) and resamples a
rejection from norm(max(0, p − q)) (`sampling.accept_sampled`). It accepts as often as any exact
rule can, but how many random numbers a row draws depends on its k, so the same seed gives other
text under another batch size, policy, drafter or after a resume.

`gumbel`: one Gumbel noise vector g_t per (job seed, request key, output position t), drawn from
that key alone. The token at position t is argmax(log p_t + g_t), which is distributed exactly as
p_t (the Gumbel-max trick), and the drafter proposes argmax(log q_t + g_t) with the same g_t. A
draft is accepted exactly when it equals the target's own choice: the greedy rule on perturbed
argmaxes. Every emitted token is the target's choice at its position with its position's noise,
so the text is the target's own seeded sample whatever the batch, drafter, k, worker count or
resume, and its law is the target's. Acceptance is lower: a draft must agree with the target's
choice, not merely be likely under p.
"""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol

import torch

from specbatch.core import Row
from specbatch.engine.sampling import accept_greedy, accept_sampled, request_generator, sample, warp

CouplingKind = Literal["rejection", "gumbel"]


class Coupling(Protocol):
    """The randomness of sampled rows (not `is_greedy`); greedy rows never reach it."""

    def admit(self, row: Row) -> None:
        """Set up the row's random state (once per request, kept across preemption)."""

    def release(self, row: Row) -> None:
        """Forget a finished row's random state."""

    def constrains(self, row: Row) -> bool:
        """Whether a grammar masks this row's draws (`engine/constraints.MaskedCoupling`): a drafter
        then draws its greedy rows through `draft` too, which masks them."""

    def draft(self, row: Row, position: int, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """Draft token at output position `position` from draft logits [vocab]; returns it and the
        warped q it was drawn from when the verification needs it (None otherwise)."""

    def verify(self, row: Row, drafts: list[int], draft_probs: torch.Tensor | None,
               logits: torch.Tensor) -> tuple[int, int]:
        """(num_accepted, correction or bonus token) from target logits [len(drafts) + 1, vocab]."""


class RejectionCoupling:
    def __init__(self, job_seed: int, device: torch.device | str = "cpu") -> None:
        self.job_seed, self.device = job_seed, device
        self.generators: dict[str, torch.Generator] = {}

    def admit(self, row: Row) -> None:
        if row.request_id not in self.generators:
            self.generators[row.request_id] = request_generator(row.request_id, row.params.seed, self.job_seed,
                                                                      self.device)

    def release(self, row: Row) -> None:
        self.generators.pop(row.request_id, None)

    def constrains(self, row: Row) -> bool:
        return False

    def draft(self, row: Row, position: int, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        q = warp(logits[None], row.params.temperature, row.params.top_p)[0]
        return sample(q, self.generators[row.request_id]), q

    def verify(self, row: Row, drafts: list[int], draft_probs: torch.Tensor | None,
               logits: torch.Tensor) -> tuple[int, int]:
        target_probs = warp(logits, row.params.temperature, row.params.top_p)
        return accept_sampled(drafts, draft_probs, target_probs, self.generators[row.request_id])


class GumbelCoupling:
    def __init__(self, job_seed: int) -> None:
        self.job_seed = job_seed

    def admit(self, row: Row) -> None:
        pass  # no state: the noise is a function of its key

    def release(self, row: Row) -> None:
        pass

    def constrains(self, row: Row) -> bool:
        return False

    def draft(self, row: Row, position: int, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        scores = self._log_probs(row, logits[None]) + self.noise(row, position, 1, logits.shape[-1], logits.device)
        return int(scores[0].argmax()), None

    def verify(self, row: Row, drafts: list[int], draft_probs: torch.Tensor | None,
               logits: torch.Tensor) -> tuple[int, int]:
        position = row.num_output_tokens  # the first token this verify pass emits
        noise = self.noise(row, position, logits.shape[0], logits.shape[-1], logits.device)
        choices = (self._log_probs(row, logits) + noise).argmax(dim=-1)  # [len(drafts) + 1]
        return accept_greedy(drafts, choices.tolist())

    def noise(self, row: Row, first_position: int, num_positions: int, vocab_size: int,
              device: torch.device) -> torch.Tensor:
        """Gumbel noise [num_positions, vocab] for consecutive output positions, each drawn from its
        own key, so a position's noise never depends on how many were drawn before it."""
        key = row.request_id if row.params.seed is None else f"seed={row.params.seed}"
        rows = []
        for position in range(first_position, first_position + num_positions):
            digest = hashlib.sha256(f"gumbel:{self.job_seed}:{key}:{position}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
            uniform = torch.rand(vocab_size, generator=generator, dtype=torch.float64)
            rows.append(-torch.log(-torch.log(uniform.clamp(min=1e-300))))
        return torch.stack(rows).to(device)

    @staticmethod
    def _log_probs(row: Row, logits: torch.Tensor) -> torch.Tensor:
        return warp(logits, row.params.temperature, row.params.top_p).log()  # top-p's cut tokens: -inf


def make_coupling(kind: CouplingKind, job_seed: int, device: torch.device | str = "cpu") -> Coupling:
    """`device`: the target's; Gumbel noise is drawn on the CPU (the same on every device) and moved."""
    return GumbelCoupling(job_seed) if kind == "gumbel" else RejectionCoupling(job_seed, device)
