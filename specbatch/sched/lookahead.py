"""Lookahead policies that weigh drafts against predicted round time: `adaptive` and `slack`.

Both see the batch through the cost model's shapes (roundcost.py). The verify pass pads every row
to 1 + max k, so k is a *batch* decision as much as a row's: raising the largest k costs padded
positions on every row, while a row below the largest k pays only its own draft rows.
Expected committed tokens of a row with acceptance α and k drafts: E(α, k) = (1 − α^(k+1))/(1 − α);
the j-th draft adds α^j. A row drafting by lookup (n-gram, suffix) costs no draft rows but host time
once it drafts at all, whatever its k: its lookup and the tokens its index catches up on
(`RoundCostModel`), a fixed price the row's drafts must repay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from specbatch.core import Row
from specbatch.sched.context import SchedContext
from specbatch.sched.estimates import expected_tokens
from specbatch.sched.pass_profile import speedup_limit
from specbatch.sched.roundcost import DecodeShape, RoundCostModel, draft_lag


@dataclass
class _Batch:
    """The per-row inputs of one choice: acceptance, cap, first query position, draft-cache lag, and
    whether the row's drafts cost draft-model work (`SchedContext.drafts_with_model`); a row drafting
    by lookup has no draft-cache lag and no draft-row price, but its lookup's host time and its
    index's lag (`index_lags`, spread like `lags`)."""

    alphas: list[float]
    caps: list[int]
    starts: list[int]
    lags: list[float]
    models: list[bool] = field(default_factory=list)
    draft_ms: float = 0.0  # what a draft position costs the draft model (`RoundCostModel.draft_position_ms`)
    index_lags: list[float] = field(default_factory=list)  # tokens a lookup row's index catches up on
    lookup_row_ms: float = 0.0  # a lookup's host time per row (`CostModel.lookup_rows`)
    index_token_ms: float = 0.0  # and per token indexed (`CostModel.lookup_tokens`)
    flat: bool = False  # flat passes: a row's step 0 feeds its own lag, not the batch's largest
    # a flat pass's price per KV position of a row verifying drafts, on top of a plain row's (a bucketed
    # pass reads every row's KV wide once any row drafts: the batch's cost, not a row's)
    wide_kv_ms: float = 0.0
    log_alphas: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_alphas = [math.log(a) for a in self.alphas]
        self.models = self.models or [True] * len(self.alphas)
        self.lags = [lag if model else 0.0 for lag, model in zip(self.lags, self.models, strict=True)]
        self.index_lags = [0.0 if model else lag for lag, model in
                           zip(self.index_lags or [0.0] * len(self.models), self.models, strict=True)]
        self.max_start = max(self.starts, default=0)
        self.sum_start = sum(self.starts)
        self.expected = [_expected_table(a, cap) for a, cap in zip(self.alphas, self.caps, strict=True)]

    @classmethod
    def of(cls, ctx: SchedContext, rows: list[Row], caps: list[int], horizon: float = 1.0,
           explore_z: float = 0.0, min_job_samples: int = 0, unproven_horizon: float = 1.0) -> _Batch:
        """Lags beyond the pending token are spread over `horizon` rounds (a one-off catch-up), or
        over the rounds a row may still draft if fewer: its tokens left at 1 + α a round, the least a
        drafting row commits in expectation (a row 20 tokens from its cap cannot repay a catch-up
        over 64 rounds); with explore_z > 0, α is its upper confidence bound. But a catch-up on a
        drafter measured fewer than `min_job_samples` times (in the row's domain and by the row) is made
        on the prior's word: α is its estimate and the catch-up is spread over `unproven_horizon` rounds
        at most, but for the one row with least to catch up: the trial that measures the drafter.
        Priced as trials, at batch 32 on few-shot prompts every row indexed its 580-token prompt for
        suffix drafting on the prior's α (11% of the job) before the first verify showed that suffix
        drafts matched nothing there."""
        models = [ctx.drafts_with_model(r) for r in rows]
        draft_lags = [draft_lag(r) - 1 for r in rows]  # beyond the pending token
        index_lags = [ctx.index_lag(r) for r in rows]
        catch_ups = [lag if model else index_lag for lag, index_lag, model in zip(draft_lags, index_lags, models,
                                                                                   strict=True)]
        unproven = _unproven_catch_ups(ctx, rows, caps, catch_ups, min_job_samples)
        alphas = [_bounded_alpha(ctx, r, 0.0 if trial else explore_z) for r, trial in zip(rows, unproven, strict=True)]
        spreads = [min(min(horizon, unproven_horizon) if trial else horizon,
                       max(1.0, r.num_new_tokens_left / (1 + alpha)))
                   for r, alpha, trial in zip(rows, alphas, unproven, strict=True)]
        round_cost = ctx.round_cost
        return cls(alphas, list(caps), [r.num_computed for r in rows],
                   [1 + lag / spread for lag, spread in zip(draft_lags, spreads, strict=True)], models,
                   round_cost.draft_position_ms,
                   [lag / spread for lag, spread in zip(index_lags, spreads, strict=True)],
                   round_cost.cost.lookup_rows, round_cost.cost.lookup_tokens, round_cost.flat,
                   wide_kv_ms=round_cost.cost.wide_kv_tokens_read if round_cost.flat else 0.0)

    def shape(self, ks: list[int]) -> DecodeShape:
        """The batch at these ks (`DecodeShape.add` row by row, its totals already summed; the solve's
        innermost step)."""
        shape = DecodeShape(len(ks), self.max_start, max(ks, default=0), sum_start=self.sum_start, sum_all_k=sum(ks))
        for k, start, lag, index_lag, model in zip(ks, self.starts, self.lags, self.index_lags, self.models,
                                                   strict=True):
            if k <= 0:
                continue
            shape.num_wide += 1
            shape.sum_wide_start += start
            if model:
                shape.num_drafting += 1
                shape.max_lag = max(shape.max_lag, lag)
                shape.sum_k += k
                shape.sum_lag += lag
            else:
                shape.num_lookup += 1
                shape.sum_index_lag += index_lag
        return shape

    def row_terms(self, index: int, rate: float, batch_lag: float = 0.0) -> tuple[float, float, float]:
        """(tokens one more draft position of row `index` costs at `rate` tokens per ms, its lag, and the
        tokens drafting at all costs it): k drafts from a draft model cost the row price·(k − 1 + lag),
        the lag its own (flat passes) or the batch's largest where step 0 pads to it (`batch_lag`); a
        lookup costs its host time whatever k (`fixed`), and any drafting row reads its KV as a wide row
        (`fixed`, at k = 1: a lower bound, as `_bound` needs). Verify positions are the batch's (every row
        is charged to the largest k), so they are not the row's."""
        wide = rate * self.wide_kv_ms * (self.starts[index] + 2)
        if not self.models[index]:
            return 0.0, 0.0, rate * (self.lookup_row_ms + self.index_token_ms * self.index_lags[index]) + wide
        if self.draft_ms <= 0:
            return 0.0, 0.0, wide
        lag = self.lags[index] if self.flat else max(batch_lag, self.lags[index])
        return rate * self.draft_ms, lag, wide

    def tokens(self, ks: list[int]) -> float:
        return sum(table[k] for table, k in zip(self.expected, ks, strict=True))


@dataclass
class AdaptiveLookahead:
    """Maximize the batch's expected committed tokens per predicted millisecond,

        max_k  Σ_i E(α_i, k_i) / T(k),   T from the cost model (padding, draft passes, lags),

    so each row's k is "expected tokens per unit of predicted round cost" with the cost counted at
    the margin, given the batch. Solved over the shared largest k, K = 0..max cap (stopping once the
    ratio has fallen for two K in a row, as it does past its peak): with K
    fixed the verify pass is fixed and a row's further drafts only cost draft rows, so (Dinkelbach)
    with λ = Σ E / T each row maximizes E(α_i, k) − λ·c_draft_position·(k − 1 + lag): drafts j ≤ k* with
    α^j ≥ λ·c_draft_position are worth it, k* = ⌊ln(λ·c) / ln α⌋, and the row drafts at all only if
    Σ_{j≤k*} α^j beats its catch-up cost. Iterate λ a few times, keep the K with the best ratio.
    k = 0 falls out where speculation does not pay: a large batch (the padded verify grows with
    B·K) or a poorly matched domain (α̂ small, shrunk from the domain's statistics).

    Hysteresis: the previous round's K is kept unless another K is `hysteresis` better. A row that
    stopped drafting must catch its draft cache up (its lag, padded across drafting rows at step 0):
    that switching cost is counted in T, spread over `switch_horizon` rounds since it is paid once;
    after the draft gate's plain rounds, over the gate's interval (what drafting may then run).

    Exploration: α is taken at its upper confidence bound (`explore_z` standard deviations), so a
    domain with little evidence still drafts enough to be measured; the bonus fades as √(1/n). A
    catch-up (a draft cache or suffix index behind by more than a round's tokens) is an investment, not
    a trial: on a drafter measured fewer than `min_job_samples` times (the prior's weight; in the row's
    domain and by the row), it is priced at α's estimate and repaid within `switch_horizon` rounds. Where
    the round-time model is learnt on the run and has not measured the draft model, the scheduler's
    probes do (`DraftControl.probe_row`), so a pessimistic prior cannot keep k at 0. With a
    draft gate (`DraftControl.gate`), its plain rounds plan k = 0 for every row, and its drafting rounds
    (a comparison's drafting blocks, an interval it chose drafting for) draft a trial where the model
    prefers none but the passes timed at the job's start say drafting pays (`_trial`).
    """

    ctx: SchedContext
    hysteresis: float = 0.05
    switch_horizon: float = 8.0
    explore_z: float = 1.0
    min_job_samples: int = 8  # a drafter's evidence in a domain before every row may catch up to it
    num_iterations: int = 3
    name: str = "adaptive"
    last_k_max: int = field(default=0, init=False)

    def choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        if not rows or max(caps) == 0:
            return [0 for _ in rows]
        return self._choose(rows, caps) if self.ctx.draft.drafts_this_round else [0 for _ in rows]

    def drafts_when_current(self, rows: list[Row], caps: list[int]) -> bool:
        """Filling a prefilling row's draft cache costs its prompt in draft rows now; not filling it
        costs the same later, as a catch-up the row may no longer live to repay (rows that joined
        plain rounds at batch 32 never drafted): so fill when the batch, prefilling rows current,
        would draft. In the gate's plain rounds only while it compares: between comparisons plain
        rounds leave every row's draft cache behind anyway, and a comparison's first drafting round
        catches them up, priced over the interval; filling each joining row in the 64 rounds before
        every comparison, as before, cost a batch-32 job where drafting ties with plain decoding
        +6 ms a prefill round (1,700-3,400 draft rows for nothing, ~7% of the job). The price: rows
        that joined plain rounds lag by their prompts at a comparison, which favours plain decoding,
        the mode the last comparison chose. At α's estimate, not its exploring bound: exploration
        drafts where drafting costs a round's rows, not where it costs every row's prompt (the one
        trial row's catch-up measures α, `_unproven_catch_ups`)."""
        gate = self.ctx.draft.gate
        if not rows or max(caps) == 0 or (gate is not None and not gate.drafts and not gate.comparing):
            return False
        solutions = self._solutions(_Batch.of(self.ctx, rows, caps, self.switch_horizon))
        return max(solutions, key=lambda k_max: solutions[k_max][0]) > 0

    def _choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        gate = self.ctx.draft.gate
        horizon = max(self.switch_horizon, gate.interval) if gate is not None and gate.catches_up \
            else self.switch_horizon
        batch = _Batch.of(self.ctx, rows, caps, horizon, self.explore_z, self.min_job_samples, self.switch_horizon)
        solutions = self._solutions(batch)
        best = max(solutions, key=lambda k_max: solutions[k_max][0])
        kept = self.last_k_max if self.last_k_max in solutions else best
        if solutions[best][0] < solutions[kept][0] * (1 + self.hysteresis):
            best = kept
        self.last_k_max = best
        if not any(solutions[best][1]) and gate is not None and gate.drafts and (gate.comparing or gate.choice):
            ks = self._trial(batch, rows, solutions[0][0])
            if any(ks) and gate.comparing:
                gate.note_trial()
            return ks
        return solutions[best][1]

    def _trial(self, batch: _Batch, rows: list[Row], plain_rate: float) -> list[int]:
        """What the gate's drafting rounds run where the model prefers plain decoding: the plan with
        drafts it rates best (solved per largest k, or every row at min(cap, K)) among the rows whose
        catch-ups, cheapest first, together cost at most a plain round (in a comparison, all its trials'
        catch-ups together: rows caught up by its first trial draft on at almost no price, and a
        plain round per drafting round caught up 1,747 draft rows for 6 proposals in a bundled
        few-shot job at 32 rows, ~2% of it); nothing where the passes timed at the job's start do not
        say drafting pays either, at α's exploring bound (`_measured_passes_say_drafting_pays`).

        Drafting blocks that plan k = 0 compare plain decoding with itself, and only rounds that draft
        refit drafting's prices: a model that priced drafting too dear once (a slow stretch of the
        machine during the first comparison, issue 43) kept SmolLM2 on one-schema extraction plain for
        the rest of the job in 3 runs of 10, and after a trial won a comparison the interval it won
        was plain decoding again. Where the model is right a trial is a loss: catching up every row
        cost a simulated job where drafting does not pay 2% (dear suffix indexing, 8 draws), hence the
        bound, and a trial comparison ends early (`DraftGate.note_trial`). `plain_rate`: the batch's
        tokens per ms at k = 0."""
        round_cost, gate = self.ctx.round_cost, self.ctx.draft.gate
        if not self._measured_passes_say_drafting_pays(batch, rows):
            return [0 for _ in rows]
        spent_before = gate.trial_catch_up_ms if gate is not None and gate.comparing else 0.0  # this comparison's
        budget = len(rows) / plain_rate - spent_before
        catch_ups = [round_cost.draft_position_ms * (draft_lag(row) - 1) if model
                     else round_cost.cost.lookup_tokens * self.ctx.index_lag(row)
                     for row, model in zip(rows, batch.models, strict=True)]
        caps, spent = [0 for _ in rows], 0.0
        for catch_up_ms, i in sorted((ms, i) for i, ms in enumerate(catch_ups) if batch.caps[i] > 0):
            if spent + catch_up_ms > budget:
                break
            caps[i], spent = batch.caps[i], spent + catch_up_ms
        if not any(caps):
            return caps
        trial = replace(batch, caps=caps)
        lag_limits = self._lag_limits(trial, plain_rate)
        plans = [self._solve(trial, k_max, lag_limits) for k_max in range(1, max(caps) + 1)]
        for k_max in range(1, max(caps) + 1):
            uniform = [min(cap, k_max) for cap in caps]
            plans.append((trial.tokens(uniform) / round_cost.decode_ms(trial.shape(uniform)), uniform))
        ks = max((plan for plan in plans if any(plan[1])), key=lambda plan: plan[0])[1]
        if gate is not None and gate.comparing:
            gate.trial_catch_up_ms += sum(catch_up for catch_up, k in zip(catch_ups, ks, strict=True) if k)
        return ks

    def _measured_passes_say_drafting_pays(self, batch: _Batch, rows: list[Row]) -> bool:
        """Whether, at the rows' α at its exploring bound (`explore_z`), drafting beats plain decoding
        by the gate's margin with the passes priced as timed at the job's start (the online fit's
        prior, where it timed them: `CostModel.measured_coefficients`) and the rest as refitted. Only
        then can the model's preference for plain decoding be a refit gone wrong; where the prior is
        only a guess, or the refit differs in what the start did not time (a suffix index's host
        time), a trial would test the model against itself. At the bound, not the estimate: a trial
        is what measures α, and before it the estimate is the prior's (SmolLM2 one-schema extraction,
        suffix, 8 rows: at the prior's 0.5 the check said no, and 4 of 12 runs never drafted where α
        measured 0.96 in the others); the bound closes on the estimate as the evidence grows, so a
        drafter measured to lose is not tried again."""
        control = self.ctx.draft
        if control.cost_fit is None or not control.cost_fit.prior.measured_coefficients:
            return False
        prior, round_cost = control.cost_fit.prior, self.ctx.round_cost
        timed = replace(round_cost.cost, **{name: getattr(prior, name) for name in prior.measured_coefficients})
        at_start = RoundCostModel(timed, round_cost.buckets, round_cost.uses_draft_model, round_cost.flat)
        alphas = [_bounded_alpha(self.ctx, row, self.explore_z) for row in rows]
        limit, _ = speedup_limit(at_start, alphas, batch.caps, batch.starts, batch.models)
        return limit > 1.0 + (control.gate.margin if control.gate is not None else 0.0)

    def _solutions(self, batch: _Batch) -> dict[int, tuple[float, list[int]]]:
        """(tokens per ms, ks) per largest k K = 0, 1, ... while a larger K may still pay; a K whose
        upper bound (`_bound`) shows it can be neither the best nor the K kept is left out unsolved
        (at batch 128, where nothing pays, solving every K over every lag class took 2 ms a solve)."""
        plain = [0 for _ in batch.caps]
        solutions = {0: (len(plain) / self.ctx.round_cost.decode_ms(batch.shape(plain)), plain)}
        best_rate = previous_rate = solutions[0][0]
        lag_limits: list[float] | None = None
        num_worse = 0
        for k_max in range(1, max(batch.caps) + 1):
            bar = best_rate / (1 + self.hysteresis) if k_max == self.last_k_max else best_rate
            if self._bound(batch, k_max, bar) <= 0:
                num_worse, previous_rate = num_worse + 1, bar
            else:
                lag_limits = lag_limits or self._lag_limits(batch, solutions[0][0])
                rate, ks = solutions[k_max] = self._solve(batch, k_max, lag_limits)
                if max(ks) < k_max:
                    break  # no row wants this many drafts: larger K changes nothing
                num_worse = num_worse + 1 if rate < previous_rate else 0
                previous_rate, best_rate = rate, max(best_rate, rate)
            if num_worse == 2 and self.last_k_max < k_max:
                break  # the ratio has fallen twice in a row: past the best K
        return solutions

    def _bound(self, batch: _Batch, k_max: int, rate: float) -> float:
        """n + Σ_i max_k [E_i(k) − 1 − λ·c·(k − 1 + lag_i)]⁺ − λ·T_K, with λ = rate, c a draft row's
        price and T_K the round with largest k K but no draft rows: at least Σ E − λ·T of every plan
        with largest k K (step 0 pads a row to at least its own lag), so ≤ 0 means none beats λ."""
        round_cost = self.ctx.round_cost
        gains = 0.0
        for i, (table, a, log_a, cap) in enumerate(zip(batch.expected, batch.alphas, batch.log_alphas, batch.caps,
                                                       strict=True)):
            price, lag, fixed = batch.row_terms(i, rate)
            k = _row_k(a, log_a, min(cap, k_max), price, lag, fixed)
            if k:
                gains += table[k] - 1 - price * (k - 1 + lag) - fixed
        no_draft_rows = DecodeShape(len(batch.caps), batch.max_start, k_max, sum_start=batch.sum_start)
        return len(batch.caps) + gains - rate * round_cost.decode_ms(no_draft_rows)

    def _lag_limits(self, batch: _Batch, plain_rate: float) -> list[float]:
        """The largest lags worth trying for the rows that draft, one per power-of-two class of lags:
        step 0 pads every drafting row to the largest lag among them, so rows that lag by whole
        prompts must not draft beside rows that lag by one token. Priced at the batch's largest lag,
        16 rows beside one that lagged 300 tokens all drafted k = 1 and caught it up, where the 15
        others alone draft k = 3. Only classes with a row that could draft in
        a batch beating plain decoding count: such a batch's λ is at least plain decoding's, and at
        that price (its verify padding left out) the row's drafts must repay its own lag."""
        round_cost = self.ctx.round_cost
        if not round_cost.uses_draft_model or round_cost.flat:  # a flat step 0 pads no row's lag
            return [math.inf]
        price = plain_rate * round_cost.cost.draft_rows
        viable = {2.0 ** math.ceil(math.log2(lag))
                  for a, log_a, cap, lag, model in zip(batch.alphas, batch.log_alphas, batch.caps, batch.lags,
                                                       batch.models, strict=True)
                  if model and _row_k(a, log_a, cap, price, lag) > 0}
        return sorted(viable) or [1.0]

    def _solve(self, batch: _Batch, k_max: int, lag_limits: list[float]) -> tuple[float, list[int]]:
        """(tokens per ms, ks) for a largest k of k_max: the best over which rows may draft by lag."""
        if len(lag_limits) == 1:  # one class of lags (flat passes, or rows alike): the solve itself
            return self._solve_within(batch, k_max, lag_limits[0])
        return max((self._solve_within(batch, k_max, lag_limit) for lag_limit in lag_limits), key=lambda s: s[0])

    def _solve_within(self, batch: _Batch, k_max: int, lag_limit: float) -> tuple[float, list[int]]:
        """(tokens per ms, ks) for a largest k of k_max, rows lagging by more than lag_limit not drafting."""
        round_cost = self.ctx.round_cost
        caps = [min(cap, k_max) if lag <= lag_limit else 0 for cap, lag in zip(batch.caps, batch.lags, strict=True)]
        ks = caps
        shape = batch.shape(ks)
        rate = batch.tokens(ks) / round_cost.decode_ms(shape)  # λ: tokens per ms
        for _ in range(self.num_iterations):
            new_ks = [_row_k(a, log_a, cap, *batch.row_terms(i, rate, shape.max_lag))
                      for i, (a, log_a, cap) in enumerate(zip(batch.alphas, batch.log_alphas, caps, strict=True))]
            if new_ks == ks:
                break
            ks, shape = new_ks, batch.shape(new_ks)
            rate = batch.tokens(ks) / round_cost.decode_ms(shape)
        return rate, ks


def _bounded_alpha(ctx: SchedContext, row: Row, explore_z: float) -> float:
    """The row's α at `explore_z` standard deviations above its estimate, kept inside (0, 1) for its
    logarithm."""
    return min(max(ctx.alphas.optimistic_alpha(row, explore_z), 1e-6), 1 - 1e-9)


def _unproven_catch_ups(ctx: SchedContext, rows: list[Row], caps: list[int], catch_ups: list[int],
                        min_job_samples: int) -> list[bool]:
    """Per row, whether drafting for it first catches up more than a round's tokens (`catch_ups`: its
    draft cache's or suffix index's lag), with a drafter measured fewer than `min_job_samples` times in
    the row's domain and by the row itself; False for the one such row with the least to catch up (the
    trial)."""
    if not min_job_samples:
        return [False for _ in rows]
    unproven = [lag > 1 + cap and ctx.alphas.num_samples(row) + ctx.alphas.job_samples(row) < min_job_samples
                for row, cap, lag in zip(rows, caps, catch_ups, strict=True)]
    if any(unproven):
        unproven[min((lag, i) for i, lag in enumerate(catch_ups) if unproven[i])[1]] = False
    return unproven


def _expected_table(alpha: float, cap: int) -> list[float]:
    """E(α, k) for k = 0..cap, by E(α, k) = E(α, k − 1) + α^k: a batch's tokens become a sum of lookups."""
    table, power = [1.0], 1.0
    for _ in range(cap):
        power *= alpha
        table.append(table[-1] + power)
    return table


def _row_k(alpha: float, log_alpha: float, k_cap: int, price: float, lag: float, fixed: float = 0.0) -> int:
    """argmax_k E(α, k) − price·(k − 1 + lag) − fixed over k ∈ {0} ∪ {1..k_cap} (0 < α < 1; the last
    two only for k ≥ 1)."""
    if k_cap <= 0:
        return 0
    if price <= 0:
        return k_cap if fixed <= 0 or expected_tokens(alpha, k_cap) - 1.0 > fixed else 0
    k_star = min(k_cap, max(1, int(math.log(price) / log_alpha)))
    gain = expected_tokens(alpha, k_star) - 1.0
    return k_star if gain > price * (k_star - 1 + lag) + fixed else 0


@dataclass
class SlackLookahead:
    """TAPER: drafts are opportunistic work. The round's mandatory work is one verified position per
    row; its predicted time T₀ leaves slack S = tpot_slo_ms − T₀ (every verified row commits ≥ 1
    token per round, so T ≤ tpot_slo_ms keeps every row within its per-token objective). Draft
    increments are offered best first (the j-th draft of row i is worth α_i^j tokens) and admitted
    one by one while the predicted round time with them — their externality on every co-batched
    row, padding included — still fits; an increment that does not fit is skipped, cheaper ones
    (not raising the largest k) may still fit."""

    ctx: SchedContext
    name: str = "slack"

    def drafts_when_current(self, rows: list[Row], caps: list[int]) -> bool:
        return any(self.choose(rows, caps))

    def choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        ks = [0 for _ in rows]
        if not rows or max(caps) == 0:
            return ks
        batch = _Batch.of(self.ctx, rows, caps)
        shape = batch.shape(ks)
        budget_ms = self.ctx.tpot_slo_ms
        if self.ctx.round_cost.decode_ms(shape) >= budget_ms:
            return ks
        offers = sorted((-(a ** j), j, i) for i, (a, cap) in enumerate(zip(batch.alphas, caps, strict=True))
                        for j in range(1, cap + 1))
        for _, j, i in offers:
            if ks[i] != j - 1:
                continue
            trial = _with_draft(shape, j, batch.lags[i], batch.starts[i])
            if self.ctx.round_cost.decode_ms(trial) <= budget_ms:
                shape, ks[i] = trial, j
        return ks


def _with_draft(shape: DecodeShape, k: int, lag: float, start: int) -> DecodeShape:
    """The shape after one row (its first query position `start`) goes from k − 1 to k drafts."""
    first = k == 1
    return replace(shape, max_k=max(shape.max_k, k), sum_k=shape.sum_k + 1, sum_all_k=shape.sum_all_k + 1,
                   num_drafting=shape.num_drafting + int(first), num_wide=shape.num_wide + int(first),
                   sum_wide_start=shape.sum_wide_start + (start if first else 0),
                   max_lag=max(shape.max_lag, lag) if first else shape.max_lag,
                   sum_lag=shape.sum_lag + lag if first else shape.sum_lag)
