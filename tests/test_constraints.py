"""Structured output (issue 42): constraints parsed and checked per record, and exact under speculation.

The law is the target's per-step masked, renormalised distribution. Greedy rows must equal the
target's own greedy decoding under the same llguidance masks (batch 1, no speculation); sampled rows
must follow the masked law at draft positions 0 and 1, for point-mass and sampled drafters.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import llguidance
import llguidance.torch
import pytest
import torch
from conftest import make_tokenizer
from engine_helpers import MixedLookahead, random_prompts, run_engine, tiny_config

from specbatch.config import SamplingDefaults
from specbatch.core import Proposals, RoundOutcome, Row, SamplingParams
from specbatch.data.constraints import (
    MAX_CONSTRAINT_CHARS,
    ConstraintChecker,
    ConstraintError,
    llguidance_tokenizer,
    parse_constraint,
)
from specbatch.data.ingest import RawRecord
from specbatch.data.validate import Validator
from specbatch.engine.build import load_models
from specbatch.engine.constraints import GrammarRuntime, MaskedCoupling, apply_bitmask
from specbatch.engine.coupling import RejectionCoupling
from specbatch.loop import generate

SCHEMA = {"type": "object", "properties": {"k": {"type": "string", "enum": ["yes", "no"]}, "n": {"type": "integer"}},
          "required": ["k", "n"], "additionalProperties": False}
CONSTRAINTS = [parse_constraint(fields).to_json() for fields in (
    {"json_schema": SCHEMA}, {"choice": ["alpha", "beta", "be"]}, {"regex": "[0-9]{2}-[a-c]+"},
    {"grammar": 'start: "print(" NUM ")"\nNUM: /[0-9]+/'}, {"response_format": {"type": "json_object"}})]


# --- parsing and per-record drops -------------------------------------------------------------------

def test_each_record_field_becomes_one_constraint():
    wrapped = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": SCHEMA}}
    assert parse_constraint({"response_format": wrapped}).kind == "json_schema"
    bare = parse_constraint({"json_schema": SCHEMA})
    assert parse_constraint({"json_schema": {"name": "x", "schema": SCHEMA}}) == bare
    assert parse_constraint({"json_schema": {"schema": SCHEMA, "strict": True}}) == bare  # no name: still the wrapper
    assert parse_constraint({"json_schema": {"schema": SCHEMA}}) == bare
    assert json.loads(parse_constraint({"json_schema": {"type": "object", "schema": SCHEMA}}).text)["type"] == "object"
    assert parse_constraint({"json_schema": json.dumps(SCHEMA)}) == bare  # a table's string column holds its text
    assert parse_constraint({"response_format": json.dumps(wrapped)}) == bare
    assert parse_constraint({"choice": ' ["a", "b"]'}) == parse_constraint({"choice": ["a", "b"]})
    assert parse_constraint({"response_format": {"type": "text"}}) is None
    assert parse_constraint({"response_format": {"type": "json_object"}}).kind == "json_object"
    assert parse_constraint({"choice": ["a", "b"]}).kind == "choice"
    assert parse_constraint({"grammar": 'root ::= "yes" | "no"'}).text.strip().endswith('"no"')  # GBNF -> Lark
    assert parse_constraint({}) is None
    assert parse_constraint({"json_schema": True}) == parse_constraint({"json_schema": {}})  # JSON Schema's any value
    ordered = parse_constraint({"json_schema": {"properties": {"z": {}, "a": {}}}}).text
    assert ordered.index('"z"') < ordered.index('"a"')  # the schema's key order is the output's


@pytest.mark.parametrize("fields, message", [
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", ""]}, "non-empty string"),
    ({"regex": "a", "choice": ["a"]}, "give one constraint"),
    ({"response_format": {"type": "xml"}}, "not supported"),
    ({"response_format": {"type": "json_schema"}}, "schema object"),
    ({"json_schema": [1]}, "must be an object"),
    ({"json_schema": '["a"]'}, "must be an object"),
    ({"json_schema": "{'type': 'object'}"}, "a string that is not JSON"),
    ({"response_format": "json_object"}, "a string that is not JSON"),
    ({"choice": "yes"}, "non-empty list"), ({"choice": '["a", 1]'}, "non-empty string"),
    ({"choice": "[a]"}, "not JSON"),
    ({"json_schema": False}, "matches no value"),
    ({"json_schema": {"type": "string", "description": "x" * MAX_CONSTRAINT_CHARS}}, "over the limit"),
])
def test_malformed_constraints_are_refused(fields, message):
    with pytest.raises(ConstraintError, match=message):
        parse_constraint(fields)


@pytest.mark.parametrize("fields, message", [
    ({"json_schema": {"type": "objectx"}}, "Invalid type"),
    ({"json_schema": {"type": "object", "dependentSchemas": {}}}, "Unimplemented keys"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, "Unknown format"),
    ({"regex": "a(b"}, "unclosed group"),
    ({"grammar": "start: foo"}, "unknown name"),
    ({"regex": "a[^\\s\\S]b"}, "does not compile"),  # matches nothing: found by the first mask
])
def test_a_constraint_that_does_not_compile_drops_only_its_record(tiny_pair, fields, message):
    validator = Validator(SamplingDefaults(), tokenizer=tiny_pair[2])
    bad = validator(RawRecord(0, {"id": "bad", "prompt": "x", **fields}))
    good = validator(RawRecord(1, {"id": "good", "prompt": "x", "choice": ["a", "b"]}))
    assert bad.drop_reason == "invalid_constraint" and message in bad.drop_message
    assert good.drop_reason is None and json.loads(good.constraint)["kind"] == "choice"


def test_each_choice_is_its_own_text_whatever_characters_it_holds():
    """A choice becomes a Lark literal: one holding DEL, which JSON leaves raw and a Lark string may not
    hold, failed with a lexer error."""
    choices = ["a\x7fb", "tab\tx", 'q"uote', "back\\slash", "nul\x00", "line\nbreak", "日本", "😀", "<|pad|>"]
    constraint = parse_constraint({"choice": choices})
    ConstraintChecker(TOKENIZER).check(constraint)
    tokenizer = llguidance_tokenizer(TOKENIZER)
    for choice in choices:
        matcher = llguidance.LLMatcher(tokenizer, constraint.grammar(), log_level=0)
        assert matcher.consume_tokens(TOKENIZER.encode(choice, split_special_tokens=True)), choice
        assert matcher.is_accepting(), choice


def test_a_one_megabyte_schema_is_a_clear_drop():
    big = {"type": "object", "properties": {f"field_{i:06d}": {"type": "string"} for i in range(30_000)}}
    assert len(json.dumps(big)) > 1_000_000
    request = Validator(SamplingDefaults())(RawRecord(0, {"prompt": "x", "json_schema": big}))
    assert request.drop_reason == "invalid_constraint" and "over the limit" in request.drop_message


def test_ten_thousand_distinct_schemas_keep_the_compile_cache_bounded():
    checker = ConstraintChecker(max_cached=64)
    for i in range(10_000):
        schema = {"type": "object", "properties": {f"f{i}": {"type": "integer"}}}
        checker.check(parse_constraint({"json_schema": schema}))
        assert checker.num_cached <= 64


def test_openai_batch_bodies_carry_response_format():
    validator = Validator(SamplingDefaults(), openai_batch=True)
    body = {"messages": None, "prompt": "x", "response_format": {"type": "json_schema",
                                                                 "json_schema": {"name": "s", "schema": SCHEMA}}}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x",
            "response_format": body["response_format"]}}
    request = validator(RawRecord(0, line))
    assert json.loads(request.constraint)["kind"] == "json_schema" and request.metadata is None
    line = {**line, "custom_id": "b", "body": {"prompt": "x", "response_format": {"type": "json_object"}}}
    assert json.loads(validator(RawRecord(1, line)).constraint)["kind"] == "json_object"


# --- greedy: the target's own decoding under the same masks -----------------------------------------

def masked_greedy_reference(model, tokenizer, prompt: list[int], max_new_tokens: int, constraint: str | None,
                            eos: int) -> list[int]:
    """The target alone, batch 1, no speculation: argmax of its logits under llguidance's mask."""
    vocab = model.get_output_embeddings().weight.shape[0]
    matcher = None
    if constraint is not None:
        from specbatch.data.constraints import Constraint

        matcher = llguidance.LLMatcher(llguidance_tokenizer(tokenizer, vocab, eos),
                                       Constraint.from_json(constraint).grammar(), log_level=0)
    ids, out = list(prompt), []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1, :vocab]
        if matcher is not None:
            bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            logits = apply_bitmask(logits[None], bitmask)[0]
        token = int(logits.argmax())
        out.append(token)
        if token == eos:
            break
        if matcher is not None:
            assert matcher.consume_token(token)
        ids.append(token)
    return out


@pytest.fixture(scope="module")
def constrained_requests(tiny_pair):
    models = load_models(tiny_config(tiny_pair))
    tokenizer = tiny_pair[2]
    requests = [(prompt, max_new + 16) for prompt, max_new in random_prompts(tokenizer, 12, seed=42, max_len=20)]
    constraints = [CONSTRAINTS[i % len(CONSTRAINTS)] if i % 6 != 5 else None for i in range(len(requests))]
    refs = [masked_greedy_reference(models.target, tokenizer, prompt, max_new, constraint, tokenizer.eos_token_id)
            for (prompt, max_new), constraint in zip(requests, constraints, strict=True)]
    return models, requests, constraints, refs


def run_constrained(config, models, requests, constraints, lookahead=None, **params):
    """Requests r0, r1, ... with their constraints through one engine on the tiny pair."""
    _, recorder, engine = run_engine(config, [], lookahead=lookahead, models=models)
    rows = [Row(f"r{i}", prompt, SamplingParams(max_new_tokens=max_new, constraint=constraint, **params))
            for i, ((prompt, max_new), constraint) in enumerate(zip(requests, constraints, strict=True))]
    return generate(engine, rows), recorder


@pytest.mark.parametrize("drafter, lookahead, batch", [
    ("draft", "fixed:4", 5), ("ngram", "mixed", 7), ("suffix", "fixed:3", 12), ("none", "fixed:4", 4),
    ("draft", "mixed", 1), ("suffix+ngram+draft", "fixed:4", 6)])
def test_greedy_under_constraints_equals_masked_target(tiny_pair, constrained_requests, drafter, lookahead, batch):
    """Rows join and leave (batch < requests), acceptance differs per row (mixed k), forced drafts
    and cut drafts in the same rounds: every output is the masked target's own greedy decoding."""
    models, requests, constraints, refs = constrained_requests
    policy = MixedLookahead() if lookahead == "mixed" else None
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                         f"scheduler.lookahead={'fixed:8' if policy else lookahead}",
                         "scheduler.prefill_chunk=fixed:16")
    rows, recorder = run_constrained(config, models, requests, constraints, lookahead=policy)
    for i, ref in enumerate(refs):
        assert rows[f"r{i}"].output_ids == ref, f"r{i} ({constraints[i]}) left the masked target's greedy output"
    if drafter != "none":
        assert sum(r.num_forced_proposed for r in recorder.rounds) > 0
        forced = [(r.num_forced_proposed, r.num_forced_accepted) for r in recorder.rounds]
        assert all(proposed == accepted for proposed, accepted in forced)  # a single allowed token: p = 1
    assert all(r.mask_ms >= 0 and r.num_forced_accepted <= r.num_accepted for r in recorder.rounds)


def test_greedy_under_constraints_with_an_eagle_head(tiny_pair, tiny_eagle, constrained_requests):
    """The head's draft vocabulary is reduced: masked, a greedy row drafts the allowed token it
    scores highest; sampled rows draw from its masked law (and run to the end)."""
    _, requests, constraints, refs = constrained_requests
    config = tiny_config(tiny_pair, "drafter.kind=eagle", f"models.eagle={tiny_eagle}", "scheduler.max_batch_rows=5",
                         "scheduler.lookahead=fixed:3")
    models = load_models(config)
    rows, recorder = run_constrained(config, models, requests, constraints)
    for i, ref in enumerate(refs):
        assert rows[f"r{i}"].output_ids == ref
    assert sum(r.num_accepted for r in recorder.rounds) > sum(r.num_forced_accepted for r in recorder.rounds)
    rows, _ = run_constrained(config, models, requests, constraints, temperature=0.8)
    assert all(row.finish_reason in ("eos", "length") for row in rows.values())


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_gumbel_sampled_text_under_constraints_is_the_targets_own(tiny_pair, constrained_requests, drafter):
    """With the gumbel coupling a sampled row's text is the masked target's own seeded sample: the
    same with a drafter at batch 4 as plain decoding one row at a time."""
    models, requests, constraints, _ = constrained_requests
    outputs = []
    for settings in ((f"drafter.kind={drafter}", "scheduler.max_batch_rows=4"),
                     ("drafter.kind=none", "scheduler.max_batch_rows=1")):
        config = tiny_config(tiny_pair, "sampling.coupling=gumbel", *settings)
        rows, _ = run_constrained(config, models, requests, constraints, temperature=1.0, seed=3)
        outputs.append({request_id: row.output_ids for request_id, row in rows.items()})
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("drafter", ["none", "draft"])
def test_forced_text_holding_a_special_tokens_literal_is_written_as_text(tiny_pair, constrained_requests, drafter):
    """llguidance reads forced text with the tokenizer, which takes a special token's literal (`<eos>`)
    for that token: its mask there admitted that token alone, which its matcher then refuses. EOS ended
    the answer there (an invalid answer, finished `eos`), another special token failed the row."""
    models, requests, _, _ = constrained_requests
    tokenizer = tiny_pair[2]
    schema = {"type": "object", "properties": {"<eos>": {"type": "boolean"}}, "required": ["<eos>"],
              "additionalProperties": False}
    fields = [{"regex": "<eos>x"}, {"choice": ["<pad>!"]}, {"json_schema": schema}]
    constraints = [parse_constraint(field).to_json() for field in fields]
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", "scheduler.lookahead=fixed:3")
    rows, _ = run_constrained(config, models, [(prompt, 24) for prompt, _ in requests[:3]], constraints)
    texts = [tokenizer.decode([t for t in rows[f"r{i}"].output_ids if t != tokenizer.eos_token_id],
                              skip_special_tokens=True) for i in range(3)]
    assert [rows[f"r{i}"].finish_reason for i in range(3)] == ["eos"] * 3, texts
    assert texts[:2] == ["<eos>x", "<pad>!"]
    assert set(json.loads(texts[2])) == {"<eos>"}


def test_a_constraint_that_fails_in_the_engine_drops_only_its_row(tiny_pair, constrained_requests):
    """Ingest refuses such a record first; a row that reaches the engine anyway (no tokenizer at
    ingest) fails alone, with the library's message, and its batch-mates finish as before."""
    from specbatch.data.constraints import Constraint

    models, requests, constraints, refs = constrained_requests
    broken = Constraint("regex", "a(b").to_json()
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=4")
    rows, _ = run_constrained(config, models, requests[:4], [broken, *constraints[1:4]])
    assert rows["r0"].drop_reason == "failed" and "unclosed group" in rows["r0"].drop_message
    assert [rows[f"r{i}"].output_ids for i in range(1, 4)] == refs[1:4]


def test_preempted_constrained_rows_resume_exactly(tiny_pair, constrained_requests):
    models, requests, constraints, refs = constrained_requests
    config = tiny_config(tiny_pair, "capacity.kv_tokens=90", "capacity.admission=optimistic",
                         "scheduler.max_batch_rows=8", "scheduler.order=specbatch", "scheduler.lookahead=fixed:3")
    rows, recorder = run_constrained(config, models, requests, constraints)
    assert sum(row.num_preemptions for row in rows.values()) > 0
    for i, ref in enumerate(refs):
        assert rows[f"r{i}"].output_ids == ref


def test_completed_outputs_are_in_their_language(tiny_pair, constrained_requests):
    """Greedy and sampled: a row that ended by EOS parses (schema, choice, regex); one cut by length
    says `length`."""
    import re

    import jsonschema

    models, requests, constraints, _ = constrained_requests
    tokenizer = tiny_pair[2]
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=6")
    for params in ({}, {"temperature": 1.0}):
        rows, _ = run_constrained(config, models, requests, constraints, **params)
        for i, constraint in enumerate(constraints):
            row = rows[f"r{i}"]
            text = tokenizer.decode([t for t in row.output_ids if t != tokenizer.eos_token_id])
            if constraint is None or row.finish_reason != "eos":
                assert row.finish_reason in ("eos", "length")
                continue
            kind = json.loads(constraint)["kind"]
            if kind == "json_schema":
                jsonschema.validate(json.loads(text), SCHEMA)
            elif kind == "json_object":
                assert isinstance(json.loads(text), dict)
            elif kind == "choice":
                assert text in ("alpha", "beta", "be")
            elif kind == "regex":
                assert re.fullmatch("[0-9]{2}-[a-c]+", text)


# --- the sampled law at draft positions 0 and 1 -----------------------------------------------------

TOKENIZER = make_tokenizer()
_LIKELY = TOKENIZER.convert_tokens_to_ids(list("abcd0123"))


def _logits(history: tuple[int, ...], vocab: int, salt: str, scale: float = 1.5) -> torch.Tensor:
    """Deterministic logits per history; most mass on the characters the test grammars use, so that
    a drafter's unmasked law puts much of its mass on tokens the grammar forbids at a position."""
    seed = int.from_bytes(hashlib.sha256(f"{salt}:{history}".encode()).digest()[:8], "little") & (2**62)
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    logits[_LIKELY] += 6.0
    return logits


def _target(history, vocab):
    return _logits(history, vocab, "target")


def _draft(history, vocab):  # the drafter's law: related to the target's, not equal
    return _target(history, vocab) + _logits(history, vocab, "draft", 1.5)


def _masked_law(grammar: GrammarRuntime, constraint: str) -> dict[tuple[int, int], float]:
    """The exact law of the first two output tokens under the masked target (the prompt is empty)."""
    vocab, law = grammar.vocab_size, {}
    matcher = grammar._fresh_matcher(constraint)

    def masked(history):
        bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        return torch.softmax(apply_bitmask(_target(history, vocab)[None], bitmask)[0], dim=-1)

    first = masked(())
    for x0 in first.nonzero().flatten().tolist():
        assert x0 != grammar.eos_token_id and matcher.consume_token(x0)
        second = masked((x0,))
        for x1 in second.nonzero().flatten().tolist():
            law[x0, x1] = float(first[x0] * second[x1])
        matcher.rollback(1)
    return law


def _sample_two(grammar: GrammarRuntime, constraint: str, trial: int, drafter: str) -> tuple[int, int]:
    """One row through the exact pipeline (draft masked, cut, verify masks, acceptance) until it has
    committed two tokens; rounds draft 2 tokens, so the first covers draft positions 0 and 1."""
    vocab = grammar.vocab_size
    row = Row(f"t{trial}", [], SamplingParams(max_new_tokens=2, temperature=1.0, constraint=constraint))
    base = RejectionCoupling(job_seed=trial)
    coupling = MaskedCoupling(base, grammar)
    coupling.admit(row)
    grammar.admit(row)
    while row.num_output_tokens < 2:
        grammar.begin([row])
        history = tuple(row.output_ids)
        if drafter == "sampled":
            drafts, qs = [], []
            for j in range(2):
                token, q = coupling.draft(row, row.num_output_tokens + j, _draft(history + tuple(drafts), vocab))
                drafts.append(token)
                qs.append(q)
            proposals = Proposals([drafts], [torch.stack(qs)], [0])
        else:  # point masses: one the grammar may allow, one it may not
            proposals = Proposals([[3 + trial % 5, 7 + trial % 11]], [None], [0])
        grammar.cut([row], proposals)
        drafts = proposals.tokens[0]
        job = grammar.start_masks([row], proposals.tokens)
        logits = torch.stack([_target(history + tuple(drafts[:j]), vocab) for j in range(len(drafts) + 1)])
        grammar.apply_masks(job, logits, RoundOutcome())
        num_accepted, token = coupling.verify(row, drafts, proposals.draft_probs[0], logits)
        row.token_ids.extend(drafts[:num_accepted] + [token])  # the commit (positions past 2 never matter)
    grammar.release(row)
    return row.output_ids[0], row.output_ids[1]


@pytest.mark.parametrize("drafter", ["sampled", "point"])
@pytest.mark.parametrize("constraint", [{"choice": ["ab", "abc", "ba", "b", "cab"]}, {"regex": "[a-d][0-3]?"}])
def test_sampled_law_under_a_mask_is_the_masked_target(drafter, constraint):
    grammar = GrammarRuntime(TOKENIZER, len(TOKENIZER), TOKENIZER.eos_token_id)
    spec = parse_constraint(constraint).to_json()
    law = _masked_law(grammar, spec)
    num_trials = 2000
    counts = Counter(_sample_two(grammar, spec, trial, drafter) for trial in range(num_trials))
    assert set(counts) <= set(law), f"outcomes outside the masked law: {set(counts) - set(law)}"
    # Pearson's chi-square over outcomes with expected count >= 5 (the rest pooled)
    big = {o for o, p in law.items() if p * num_trials >= 5}
    cells = [(counts[o], law[o] * num_trials) for o in big]
    rest = (num_trials - sum(c for c, _ in cells), num_trials * (1 - sum(law[o] for o in big)))
    if rest[1] >= 5:
        cells.append(rest)
    chi2 = sum((c - e) ** 2 / e for c, e in cells)
    df = len(cells) - 1
    assert df >= 2, "the law must have several outcomes to test"
    assert chi2 < df + 5 * (2 * df) ** 0.5, f"chi2 {chi2:.1f} over {df} degrees of freedom: {counts} vs {law}"
    grammar.close()


# --- a job: ingest drops, results and OpenAI output ---------------------------------------------------

def test_a_job_honours_constraints_and_drops_only_bad_ones(tiny_pair, tmp_path):
    from job_helpers import results, submit, write_config, write_jsonl

    schema = {"type": "object", "properties": {"k": {"type": "string", "enum": ["yes", "no"]}}, "required": ["k"],
              "additionalProperties": False}
    wrapped = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = {"max_tokens": 30, "response_format": wrapped}
    lines = [{"custom_id": "schema", "method": "POST", "url": "/v1/completions", "body": {"prompt": "def", **body}},
             {"custom_id": "object", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "def", "max_tokens": 4, "response_format": {"type": "json_object"}}},
             {"custom_id": "xml", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "def", "response_format": {"type": "xml"}}},
             {"custom_id": "plain", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "def", "max_tokens": 3}}]
    dataset = write_jsonl(tmp_path / "batch.jsonl", lines)
    run = submit(dataset, write_config(tmp_path, tiny_pair), "j", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    by_id = {row["request_id"]: row for row in results(tmp_path / "out" / "j")}
    assert by_id["schema"]["finish_reason"] == "eos" and json.loads(by_id["schema"]["text"])["k"] in ("yes", "no")
    assert by_id["object"]["finish_reason"] == "length" and by_id["object"]["text"].startswith("{")  # unfinished
    assert by_id["xml"]["drop_reason"] == "invalid_constraint" and by_id["plain"]["status"] == "completed"
    output = [json.loads(line) for line in (tmp_path / "out" / "j" / "openai_output.jsonl").read_text().splitlines()]
    choices = {line["custom_id"]: line["response"]["body"]["choices"][0] for line in output if line["response"]}
    assert choices["object"]["finish_reason"] == "length" and choices["schema"]["finish_reason"] == "stop"
    assert [line["error"]["code"] for line in output if line["error"]] == ["invalid_constraint"]
    # the report's structured-output figures equal the ones computed by hand from the rounds
    from report_oracle import expected_structured_output
    from test_report import assert_rows_equal

    from specbatch import report

    connection = report.connect([tmp_path / "out" / "j"])
    figures = report.run_query(connection, "structured_output").records()
    connection.close()
    assert_rows_equal(figures, expected_structured_output([tmp_path / "out" / "j"]))
    assert figures[0]["num_masked_rounds"] > 0 and figures[0]["num_forced_proposed"] > 0
