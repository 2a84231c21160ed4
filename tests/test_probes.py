"""Draft probes (`RoundPlan.probe`): while the round-time model learns on the run and has not measured
the draft model, a plan without drafts has the draft model draft one token for one row and verifies
none of it. Outputs stay the target's own (greedy, and seeded samples under the gumbel coupling), the
verify pass keeps its single position per row, and the cost fit gets its drafting phases."""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_helpers import MixedLookahead, assert_exact, greedy_reference, random_prompts, run_engine, tiny_config

from specbatch import ledger
from specbatch.config import load_config
from specbatch.engine.build import load_models
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sched.online_cost import OnlineCostFit
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.arrivals import Offline
from specbatch.sim.run import simulate
from specbatch.sim.workload import DomainMix, UniformLength, Workload


def always_probing(engine) -> None:
    """Make every plan without drafts probe, for the whole run (the draft cost is never 'known')."""
    draft = engine.scheduler.draft
    draft.cost_fit = OnlineCostFit(CPU_DEMO_PROFILE, min_draft_rounds=10**9)
    draft.probe_every = 0


def probing_run(config, requests, cycle: tuple[int, ...], **params):
    rows, recorder, _ = run_engine(config, requests, MixedLookahead(cycle), prepare=always_probing, **params)
    return rows, recorder


def drafted(record) -> bool:
    """Whether a round ran a drafting phase, not just the draft cache's fill beside a prefill (one pass)."""
    return record.num_draft_passes > (1 if record.num_prefill_rows else 0)


def drafter_settings(request, drafter: str) -> list[str]:
    if drafter == "eagle":
        return ["drafter.kind=eagle", f"models.eagle={request.getfixturevalue('tiny_eagle')}"]
    return ["drafter.kind=draft"]


@pytest.fixture(scope="module")
def references(tiny_pair):
    """Prompts and the target's own greedy decoding of each, alone."""
    tokenizer = tiny_pair[2]
    target = load_models(tiny_config(tiny_pair, "drafter.kind=none")).target
    requests = random_prompts(tokenizer, 10, seed=5)
    refs = [greedy_reference(target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    return requests, refs


@pytest.mark.parametrize("drafter", ["draft", "eagle"])
@pytest.mark.parametrize(("batch", "cycle"), [(1, (0, 0, 2)), (5, (0, 0, 0, 3))])
def test_probes_leave_greedy_output_the_targets_and_pad_no_verify(request, tiny_pair, references, drafter, batch,
                                                                  cycle):
    config = tiny_config(tiny_pair, *drafter_settings(request, drafter), f"scheduler.max_batch_rows={batch}",
                         "scheduler.lookahead=fixed:3", "scheduler.prefill_chunk=fixed:16")
    requests, refs = references
    rows, recorder = probing_run(config, requests, cycle)
    assert_exact(rows, refs)
    probes = [r for r in recorder.rounds if r.num_decode_rows and r.max_k == 0 and drafted(r)]
    assert probes, "no round probed"
    for record in probes:
        assert record.num_proposed == 0 and record.num_speculating_rows == 0
        assert record.query_len == 1  # no row's verify was padded for the probe
        assert record.draft_ms > 0
    # a probe caught its row's draft cache up: the rows finished with their draft work counted
    assert sum(r.num_draft_rows for r in recorder.rounds) == sum(row.num_draft_positions for row in rows.values())


@pytest.mark.parametrize("drafter", ["draft", "eagle"])
def test_probes_leave_seeded_samples_the_targets_own(request, tiny_pair, drafter):
    """Under the gumbel coupling a sampled text is the target's own seeded sample whatever drafts:
    a run that probes gives what plain decoding gives."""
    settings = ["sampling.coupling=gumbel", "scheduler.max_batch_rows=4", "scheduler.lookahead=fixed:3"]
    requests = random_prompts(tiny_pair[2], 8, seed=6)
    params = {"temperature": 1.0, "seed": 11}
    plain, _, _ = run_engine(tiny_config(tiny_pair, "drafter.kind=none", *settings), requests, **params)
    probed, recorder = probing_run(tiny_config(tiny_pair, *drafter_settings(request, drafter), *settings),
                                   requests, (0, 0, 2), **params)
    assert {key: row.output_ids for key, row in probed.items()} == {key: row.output_ids for key, row in plain.items()}
    assert any(r.max_k == 0 and drafted(r) for r in recorder.rounds)


def test_probes_teach_the_cost_fit_drafting_without_padding_the_verify(tmp_path):
    """A prior that believes drafts far too dear keeps k = 0; probes must measure the draft model,
    and cost what one draft pass costs, not a verify padded to 2 positions for every row."""
    prior = replace(CPU_DEMO_PROFILE, draft_passes=15.0, draft_rows=0.5)
    truth = replace(CPU_DEMO_PROFILE, draft_passes=8.0, draft_rows=0.3)
    config = load_config(None, ["capacity.max_context=512", "scheduler.max_batch_rows=64",
                                "sampling.max_new_tokens=64", "scheduler.lookahead=adaptive"])
    requests = Workload(DomainMix((("code", 1.0),)), UniformLength(20, 60), UniformLength(20, 64), 64,
                        Offline()).draw(200, seed=3)
    summary = simulate(config, requests, DomainAcceptance({"code": (0.3, 50.0)}, seed=1), tmp_path / "job",
                       cost_model=truth, scheduler_cost_model=prior)
    assert summary.num_completed == len(requests)
    rounds = ledger.read_table(tmp_path / "job", "rounds").to_pylist()
    probes = [r for r in rounds if r["num_decode_rows"] > 1 and r["max_k"] == 0 and r["draft_ms"] > 0]
    assert len(probes) >= 4  # what the fit needs to know drafting's cost
    assert all(r["query_len"] == 1 and r["num_proposed"] == 0 for r in probes)
