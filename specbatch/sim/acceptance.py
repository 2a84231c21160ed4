"""Acceptance models: how many of a row's k draft tokens the simulated verifier keeps.

Drafts are accepted left to right until the first rejection (DESIGN §4), so a round's outcome is an
accepted-prefix length in [0, k]. Two models:
- `DomainAcceptance`: each request gets its own α ~ Beta per domain, and every draft is accepted
  independently with probability α until the first rejection.
- `ReplayAcceptance`: a real job's per-request histories, replayed by output position, so a policy
  that chooses different k still meets the same accepts and rejects where the real job saw them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pyarrow.parquet as pq

from specbatch.ledger import committed_parts, parse_part_name


def accepted_prefix(alpha: float, k: int, rng: random.Random) -> int:
    """Drafts accepted before the first rejection, each accepted independently with prob. `alpha`.

    P(X >= i) = α^i for i <= k, so E[X] = Σ_{i=1..k} α^i. Drawn by inversion from one uniform,
    X = min(k, floor(ln U / ln α)), so each call uses exactly one random number whatever k is.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    u = 1.0 - rng.random()  # in (0, 1]
    if k == 0 or alpha == 0.0:
        return 0
    if alpha == 1.0:
        return k
    return min(k, int(math.log(u) / math.log(alpha)))


class AcceptanceModel(Protocol):
    """What the SimBackend asks each round, per decoding row with lookahead k."""

    def num_accepted(self, request_id: str, domain: str, position: int, k: int, rng: random.Random) -> int:
        """Accepted prefix length in [0, k] for drafts starting at output index `position`
        (the number of output tokens the request had when the round started)."""
        ...

    def release(self, request_id: str) -> None:
        """Forget per-request state once the request has finished."""
        ...


@dataclass
class DomainAcceptance:
    """Per-request α ~ Beta(mean·c, (1 − mean)·c) for the request's domain (key "*" is the default).

    α depends only on (seed, request_id), not on the order requests are seen, so every policy
    compared under the same seed serves the same easy and hard requests.
    """

    domains: Mapping[str, tuple[float, float]]  # domain -> (mean_alpha, concentration)
    seed: int = 0
    _alphas: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for domain, (mean, concentration) in self.domains.items():
            if not 0.0 <= mean <= 1.0 or not concentration > 0:
                raise ValueError(
                    f"domain {domain!r}: need 0 <= mean_alpha <= 1 and concentration > 0, "
                    f"got ({mean}, {concentration})"
                )

    def alpha(self, request_id: str, domain: str) -> float:
        """The request's acceptance probability (drawn once, then cached until `release`)."""
        cached = self._alphas.get(request_id)
        if cached is not None:
            return cached
        params = self.domains.get(domain, self.domains.get("*"))
        if params is None:
            raise KeyError(f"no acceptance parameters for domain {domain!r} and no '*' default")
        mean, concentration = params
        if mean in (0.0, 1.0):
            value = mean
        else:
            rng = random.Random(f"specbatch.sim.alpha:{self.seed}:{request_id}")
            value = rng.betavariate(mean * concentration, (1.0 - mean) * concentration)
        self._alphas[request_id] = value
        return value

    def num_accepted(self, request_id: str, domain: str, position: int, k: int, rng: random.Random) -> int:
        return accepted_prefix(self.alpha(request_id, domain), k, rng)

    def release(self, request_id: str) -> None:
        self._alphas.pop(request_id, None)


@dataclass
class DrafterAcceptance:
    """A job of several drafters: each drafter's own `DomainAcceptance`, so a request's α differs per
    drafter, drawn independently (give each model its own seed): a request that suits suffix drafting
    need not suit the draft model, which one α scaled per drafter cannot say. `SimBackend` draws the
    accepted prefix inline under the drafter each row drafts with."""

    drafters: Mapping[str, DomainAcceptance]

    def alpha(self, request_id: str, domain: str, drafter: str) -> float:
        return self.drafters[drafter].alpha(request_id, domain)

    def num_accepted(self, request_id: str, domain: str, position: int, k: int, rng: random.Random) -> int:
        raise TypeError("a DrafterAcceptance is drawn per drafter (SimBackend), not per request alone")

    def release(self, request_id: str) -> None:
        for model in self.drafters.values():
            model.release(request_id)


_UNKNOWN, _ACCEPT, _REJECT = 0, 1, 2


class ReplayAcceptance:
    """Replays recorded accepted-prefix histories by output position.

    A recorded round that started at output index p with lookahead k and accepted a drafts says:
    drafts for positions p .. p+a-1 were accepted and (if a < k) the draft for p+a was rejected.
    Replaying at position q with lookahead k' walks positions q, q+1, ...: a recorded accept
    continues, a recorded reject stops, and a position never drafted in the real job (a bonus or
    plain-decoding position, or past the history) is accepted with the request's fitted α
    (accepts / (accepts + rejects), the maximum-likelihood estimate under `accepted_prefix`).
    With the recorded k at the recorded positions the replay gives back the recorded history.
    """

    def __init__(
        self,
        histories: Mapping[str, Sequence[tuple[int, int]]],
        start_positions: Mapping[str, Sequence[int]] | None = None,
        fallback_alpha: float | None = None,
    ) -> None:
        """`histories[request_id]` lists (accepted, k) per round in order. Without
        `start_positions`, round i+1 is taken to start accepted_i + 1 tokens after round i,
        and the first at position 0. `fallback_alpha` (default: pooled over all requests) is
        used for requests that never proposed a draft."""
        self._outcomes: dict[str, bytearray] = {}
        self._alpha: dict[str, float | None] = {}
        total_accepts = total_rejects = 0
        for request_id, rounds in histories.items():
            starts = start_positions[request_id] if start_positions is not None else None
            outcomes, accepts, rejects = _outcomes(rounds, starts)
            self._outcomes[request_id] = outcomes
            self._alpha[request_id] = accepts / (accepts + rejects) if accepts + rejects else None
            total_accepts, total_rejects = total_accepts + accepts, total_rejects + rejects
        if fallback_alpha is None:
            pooled = total_accepts + total_rejects
            fallback_alpha = total_accepts / pooled if pooled else 0.0
        self.fallback_alpha = fallback_alpha

    def __len__(self) -> int:
        return len(self._outcomes)

    def alpha(self, request_id: str) -> float:
        """The request's fitted α, used at positions the real job never drafted."""
        value = self._alpha[request_id]
        return self.fallback_alpha if value is None else value

    def num_accepted(self, request_id: str, domain: str, position: int, k: int, rng: random.Random) -> int:
        try:
            outcomes = self._outcomes[request_id]
        except KeyError:
            raise KeyError(f"no recorded acceptance history for request {request_id!r}") from None
        for j in range(k):
            pos = position + j
            outcome = outcomes[pos] if pos < len(outcomes) else _UNKNOWN
            if outcome == _REJECT:
                return j
            if outcome == _UNKNOWN and rng.random() >= self.alpha(request_id):
                return j
        return k

    def release(self, request_id: str) -> None:
        """Histories are the model itself; nothing is dropped."""

    @classmethod
    def from_job(cls, job_dir: str | Path, fallback_alpha: float | None = None) -> ReplayAcceptance:
        """Load from a job's steps tables (JOB/steps/**/*.parquet)."""
        histories, starts = read_step_histories(job_dir)
        return cls(histories, starts, fallback_alpha)


def _outcomes(rounds: Sequence[tuple[int, int]], starts: Sequence[int] | None) -> tuple[bytearray, int, int]:
    """Per-position outcome bytes from (accepted, k) rounds; also the accept and reject counts."""
    outcomes = bytearray()
    accepts = rejects = 0
    position = 0
    for i, (accepted, k) in enumerate(rounds):
        if not 0 <= accepted <= k:
            raise ValueError(f"round {i}: need 0 <= accepted <= k, got ({accepted}, {k})")
        if starts is not None:
            position = starts[i]
        end = position + accepted + (1 if accepted < k else 0)
        if len(outcomes) < end:
            outcomes.extend(bytes(end - len(outcomes)))
        outcomes[position : position + accepted] = bytes([_ACCEPT]) * accepted
        if accepted < k:
            outcomes[position + accepted] = _REJECT
            rejects += 1
        accepts += accepted
        position += accepted + 1
    return outcomes, accepts, rejects


_Row = tuple[str, str, int, int, int, int | None]  # request_id, attempt, round_index, k, accepted, start


def _step_files(job_dir: Path) -> list[Path]:
    """Committed steps parts (results part present) when the job has a results folder, else all."""
    paths = sorted((job_dir / "steps").glob("*.parquet"))
    if (job_dir / "results").is_dir():
        committed = set(committed_parts(job_dir))
        paths = [p for p in paths if p.stem in committed]
    if not paths:
        raise FileNotFoundError(f"no committed steps Parquet parts under {job_dir / 'steps'}")
    return paths


def _attempt(path: Path) -> str:
    """Worker and run that wrote a part: a request re-run after a crash has two attempts."""
    try:
        worker_id, run_id, _ = parse_part_name(path.stem)
    except ValueError:
        return ""
    return f"{worker_id}/{run_id}"


def _read_rows(path: Path) -> list[_Row]:
    table = pq.read_table(path)
    missing = {"request_id", "round_index", "k", "num_accepted"} - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: steps table lacks columns {sorted(missing)}")
    data = table.to_pydict()
    if "num_output_tokens" in data and "num_committed" in data:
        pairs = zip(data["num_output_tokens"], data["num_committed"], strict=True)
        starts: list[int | None] = [o - c for o, c in pairs]
    else:
        starts = [None] * table.num_rows
    attempts = [_attempt(path)] * table.num_rows
    columns = (data["request_id"], attempts, data["round_index"], data["k"], data["num_accepted"], starts)
    return list(zip(*columns, strict=True))


def read_step_histories(
    job_dir: str | Path,
) -> tuple[dict[str, list[tuple[int, int]]], dict[str, list[int]] | None]:
    """Per-request (accepted, k) histories in round order from a job's committed steps parts, with
    each round's start position (num_output_tokens − num_committed) when those columns exist.

    Rows with k = 0 (plain decoding) stay in as (0, 0): they carry no acceptance evidence but
    advance the position by the one token they commit. A request with rows from several attempts
    (lost in a crash, re-run on resume) keeps only the attempt that got furthest.
    """
    by_request: dict[str, dict[str, list[_Row]]] = {}
    for path in _step_files(Path(job_dir)):
        for row in _read_rows(path):
            by_request.setdefault(row[0], {}).setdefault(row[1], []).append(row)
    histories: dict[str, list[tuple[int, int]]] = {}
    positions: dict[str, list[int]] = {}
    has_positions = True
    for request_id, attempts in by_request.items():
        furthest: list[_Row] = max(attempts.values(), key=_progress)
        rows = sorted(furthest, key=lambda r: r[2])
        histories[request_id] = [(accepted, k) for _, _, _, k, accepted, _ in rows]
        starts = [r[5] for r in rows]
        has_positions = has_positions and None not in starts
        if has_positions:
            positions[request_id] = [int(s) for s in starts if s is not None]
    return histories, (positions if has_positions else None)


def _progress(rows: list[_Row]) -> tuple[int, int]:
    """How far an attempt got: its furthest start position, then its number of rounds."""
    return max((r[5] or 0) for r in rows), len(rows)
