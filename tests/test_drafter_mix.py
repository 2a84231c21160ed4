"""Several drafters in one job (issue 43): rows switched between drafters mid-row keep the target's
greedy output and its sampling law (the token decided at draft positions 0 and 1), for every pair."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from engine_helpers import assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from test_sampling import PROMPT, assert_follows, exact_law

from specbatch.config import ConfigError, load_config
from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.loop import MemoryRecorder

KINDS = ("draft", "ngram", "suffix", "eagle")
# ordered pairs a job may mix (at most one drafter runs a model)
PAIRS = [(a, b) for a, b in itertools.permutations(KINDS, 2) if {a, b} != {"draft", "eagle"}]


@dataclass
class SwitchingLookahead:
    """Test policy: k = `k` for every row, drafting with the first drafter while the row has no output
    and the second after, or alternating round by round."""

    kinds: tuple[str, str]
    k: int = 3
    alternate: bool = False
    name: str = "switching"
    rounds: dict[str, int] = field(default_factory=dict)

    def choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        for row in rows:
            seen = self.rounds[row.request_id] = self.rounds.get(row.request_id, -1) + 1
            first = seen % 2 == 0 if self.alternate else row.num_output_tokens == 0
            row.drafter = self.kinds[0] if first else self.kinds[1]
        return [min(self.k, cap) for cap in caps]

    def drafts_when_current(self, rows: list[Row], caps: list[int]) -> bool:
        return any(caps)


def test_drafter_kind_names_several():
    config = load_config(None, ["drafter.kind=[suffix, ngram, none]"])
    assert config.drafter.kind == "suffix,ngram" and config.drafter.kinds == ("suffix", "ngram")
    assert config.drafter.model_kind is None
    assert load_config(None, ["drafter.kind=ngram,draft"]).drafter.model_kind == "draft"
    with pytest.raises(ConfigError, match="at most one drafter that runs a model"):
        load_config(None, ["drafter.kind=draft,eagle"])
    with pytest.raises(ConfigError, match="drafter kinds are"):
        load_config(None, ["drafter.kind=ngram,medusa"])


@pytest.fixture(scope="module")
def greedy_refs(tiny_pair):
    config = tiny_config(tiny_pair)
    models = load_models(config)
    tokenizer = tiny_pair[2]
    # repeated prompts, so lookups find matches and the job-wide suffix index fills
    requests = random_prompts(tokenizer, 5, seed=3) * 2
    return requests, [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
                      for p, m in requests]


@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_switching_drafters_round_by_round_keeps_greedy_output(tiny_pair, tiny_eagle, greedy_refs, pair):
    requests, refs = greedy_refs
    config = tiny_config(tiny_pair, f"drafter.kind={','.join(pair)}", f"models.eagle={tiny_eagle}",
                         "scheduler.max_batch_rows=4", "scheduler.lookahead=fixed:3")
    rows, recorder, _ = run_engine(config, requests, lookahead=SwitchingLookahead(pair, alternate=True))
    assert_exact(rows, refs)
    drafted = {step.drafter for step in recorder.steps if step.num_proposed}
    assert drafted <= set(pair) and drafted & {"draft", "eagle"} == drafted & set(pair) & {"draft", "eagle"}


def sample_switched(small_vocab_pair, small_vocab_eagle, pair: tuple[str, str], trials: int):
    """`trials` seeded requests of 3 tokens: the first round drafts k = 3 with pair[0] (its drafts at
    positions 0, 1, 2), the next with pair[1]; and the exact law of the first 3 tokens."""
    # every row admitted at once: the policy chooses for rows completing their prefill only while no
    # row decodes (`Scheduler._plan_prefill`)
    config = tiny_config(small_vocab_pair, f"drafter.kind={','.join(pair)}", "scheduler.lookahead=fixed:3",
                         f"scheduler.max_batch_rows={trials}", "scheduler.max_round_tokens=65536",
                         f"models.eagle={small_vocab_eagle}")
    models = load_models(config)
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder)
    engine.scheduler.lookahead = SwitchingLookahead(pair)
    engine.stops.eos_token_ids = set()
    rows = [Row(f"s{i}", PROMPT, SamplingParams(max_new_tokens=4, temperature=1.0, seed=i)) for i in range(trials)]
    for row in rows:
        engine.add(row)
    engine.run()
    return rows, recorder, exact_law(models.target, PROMPT, 3, 1.0, 1.0), models.target.config.vocab_size


def _check_law(small_vocab_pair, small_vocab_eagle, pair, trials):
    rows, recorder, law, vocab = sample_switched(small_vocab_pair, small_vocab_eagle, pair, trials)
    assert_follows(rows, law, vocab, 3)
    starts = [(s, s.num_output_tokens - s.num_committed) for s in recorder.steps if s.num_proposed]
    assert {s.drafter for s, start in starts if start > 0} == {pair[1]}  # every later round drafted with the second
    # each drafter's position 0 decided one of the three tokens often; position 1 (after an accepted draft) too
    for kind in pair:
        assert sum(1 for s, start in starts if s.drafter == kind and start <= 2) > 50
    assert sum(1 for s, start in starts if start <= 1 and s.num_accepted >= 1 and s.num_proposed >= 2) >= 5


def test_a_row_switched_mid_row_samples_the_target_law(small_vocab_pair, small_vocab_eagle):
    _check_law(small_vocab_pair, small_vocab_eagle, ("draft", "ngram"), 2500)


@pytest.mark.slow  # 9 pairs x ~10 s
@pytest.mark.parametrize("pair", [p for p in PAIRS if p != ("draft", "ngram")], ids="-".join)
def test_every_pair_switched_mid_row_samples_the_target_law(small_vocab_pair, small_vocab_eagle, pair):
    _check_law(small_vocab_pair, small_vocab_eagle, pair, 3000)
