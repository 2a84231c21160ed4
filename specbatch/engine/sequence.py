"""Per-request state: token ids, computed lengths, status and counters. No tensors.

Scheduling model (as in vLLM v1): a request has `num_tokens` (prompt + output) and
`num_computed` (tokens whose target KV exists). Prefill is simply `num_computed < num_tokens - 1`;
the last committed token is the *pending token*, which every verify row starts with.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    COMPLETED = "completed"
    DROPPED = "dropped"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    domain: str = ""
    arrival_s: float = 0.0
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # target KV positions that hold valid entries
    num_draft_computed: int = 0  # draft-model KV positions that hold valid entries
    slot: int | None = None
    finish_reason: str | None = None
    drop_reason: str | None = None
    drop_message: str | None = None
    metadata: str | None = None  # the input record's unknown fields (JSON), passed through to results
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    # counters, summed over rounds
    num_rounds: int = 0
    num_target_rows: int = 0
    num_draft_rows: int = 0
    num_proposed: int = 0
    num_accepted: int = 0
    num_preemptions: int = 0
    # acceptance history: accepted prefix length and k of each speculative round
    accept_history: list[tuple[int, int]] = field(default_factory=list)
    last_k: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_prefill_remaining(self) -> int:
        """Tokens before the pending token whose target KV is still missing."""
        return max(0, self.num_tokens - 1 - self.num_computed)

    @property
    def is_decoding(self) -> bool:
        return self.num_prefill_remaining == 0

    @property
    def num_new_tokens_left(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (Status.COMPLETED, Status.DROPPED, Status.CANCELLED)

    def acceptance_estimate(self, prior: float, prior_weight: float = 2.0) -> float:
        """Per-token acceptance α from this row's history, shrunk towards a prior (e.g. its domain's)."""
        accepted = sum(a for a, _ in self.accept_history)
        proposed = sum(k for _, k in self.accept_history)
        return (accepted + prior * prior_weight) / (proposed + prior_weight)
