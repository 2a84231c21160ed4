"""Structured-output constraints of a record (issue 42): what a record asks, normalized and checked.

A record constrains its output with one of (JSONL fields; an OpenAI batch body carries only
`response_format`):

    response_format  {"type": "json_schema", "json_schema": {"name", "strict", "schema"}},
                     {"type": "json_object"} or {"type": "text"} (no constraint)
    json_schema      a JSON schema object (or the {"name", "schema"} wrapper above)
                     (these two, and a choice list, may be given as their JSON text, as a table's
                     string column holds them)
    regex            a regular expression the whole output matches
    choice           a non-empty list of strings, the output being one of them
    grammar          a Lark grammar (llguidance's dialect); GBNF (`::=` rules) is converted to Lark

It becomes a `Constraint` (kind + canonical text), stored in the shard as JSON and compiled by
llguidance (`grammar()`). A constraint that does not compile, or whose language is empty (a regex
that matches nothing), drops only its record: `invalid_constraint`, with llguidance's message.
`ConstraintChecker` compiles each distinct constraint once per job (bounded LRU cache); with a
tokenizer it also computes the first mask, which is where an empty language shows.

Why llguidance, not xgrammar (`benchmarks/grammar_libraries.py`, one thread, SmolLM2's 49k
vocabulary, one 5-field schema): compile 1.2 ms vs 5.3 ms (lazy; 10,000 schemas), no dependency
(xgrammar pulls triton), parallel masks for a row's k + 1 draft positions in one call
(`fill_next_token_bitmask_par_with_draft_tokens`, the GIL released), and masks that admit only the
canonical tokenization of forced text: 18 of the answer's 38 positions had a single allowed token
(xgrammar: 1), so forced drafts are accepted with probability 1. Its mask costs more (29 µs vs
4 µs a position), which runs on CPU threads beside the verify pass.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
CONSTRAINT_FIELDS = ("response_format", "json_schema", "regex", "choice", "grammar")
MAX_CONSTRAINT_CHARS = 256 * 1024  # a schema / grammar / choice list's canonical text
MAX_CHOICES = 4096
# JSON output: keys and items separated as json.dumps does, no free whitespace (more forced tokens)
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ValueError):
    """A record's constraint is malformed or does not compile (drop reason `invalid_constraint`)."""


@dataclass(frozen=True)
class Constraint:
    kind: ConstraintKind
    text: str  # schema JSON (its properties in the record's order: the output's), regex, choice list JSON, Lark

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "text": self.text}, ensure_ascii=False)

    @classmethod
    def from_json(cls, value: str) -> Constraint:
        loaded = json.loads(value)
        return cls(loaded["kind"], loaded["text"])

    def grammar(self) -> str:
        """llguidance's grammar for this constraint (its top-level JSON)."""
        if self.kind in ("json_schema", "json_object"):
            return llguidance.LLMatcher.grammar_from_json_schema(self.text, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.text)
        if self.kind == "choice":
            choices = json.loads(self.text)
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(map(_lark_literal, choices)))
        return llguidance.LLMatcher.grammar_from_lark(self.text)


def _lark_literal(text: str) -> str:
    """`text` as a Lark string literal: JSON's escapes, and DEL escaped too, which a Lark string (as
    llguidance lexes it) may not hold raw but JSON leaves so; a choice holding one failed with a lexer error."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def parse_constraint(fields: dict[str, Any]) -> Constraint | None:
    """The record's constraint from its fields (`CONSTRAINT_FIELDS`), or None; `ConstraintError`
    when it is malformed or over the size limits."""
    given = [name for name in CONSTRAINT_FIELDS if fields.get(name) is not None]
    if len(given) > 1:
        raise ConstraintError(f"give one constraint, got {', '.join(given)}")
    if not given:
        return None
    name = given[0]
    value = fields[name]
    if name == "response_format":
        constraint = _response_format(_json_text(value, name))
    elif name == "json_schema":
        constraint = _schema(_unwrap_schema(_json_text(value, name)))
    elif name == "regex":
        constraint = Constraint("regex", _string(value, "regex"))
    elif name == "choice":  # a list's JSON text too; another string is refused as no list
        constraint = _choice(_json_text(value, name) if isinstance(value, str) and value.lstrip().startswith("[")
                             else value)
    else:
        constraint = _grammar(value)
    if constraint is not None and len(constraint.text) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError(f"{name} is {len(constraint.text):,} characters, over the limit of "
                              f"{MAX_CONSTRAINT_CHARS:,}")
    return constraint


def _json_text(value: Any, name: str) -> Any:
    """An object (or a choice list) given as its JSON text is that value: a table holds one so (a CSV
    cell cannot hold an object or a list, and a Parquet or Hugging Face struct column gives each row
    every key of every row, null where it had none), and such a schema was dropped as not an object."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as error:
        raise ConstraintError(f"{name} is a string that is not JSON ({str(error)[:200]}); give it as an object "
                              "or as its JSON text") from error


def _response_format(value: Any) -> Constraint | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConstraintError("response_format must be an object with a string type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", '{"type": "object"}')
    if kind != "json_schema":
        raise ConstraintError(f"response_format type {kind!r} is not supported; use json_schema, json_object or text")
    wrapper = value.get("json_schema")
    if not isinstance(wrapper, dict) or not isinstance(wrapper.get("schema"), dict):
        raise ConstraintError("response_format json_schema must be an object with a schema object")
    return _schema(wrapper["schema"])


_WRAPPER_KEYS = frozenset({"name", "strict", "schema", "description"})


def _unwrap_schema(value: Any) -> Any:
    """A bare schema, or OpenAI's {"name", "strict", "schema"} wrapper around one, its name given or not:
    "schema" is no JSON Schema keyword, and llguidance ignores keys it does not know, so a wrapper
    without its name read as a schema constrained nothing (any JSON value)."""
    if isinstance(value, dict) and isinstance(value.get("schema"), dict) and (
            "name" in value or value.keys() <= _WRAPPER_KEYS):
        return value["schema"]
    return value


def _schema(schema: Any) -> Constraint:
    """JSON Schema's boolean schemas too: `true` is `{}` (any value), `false` matches none."""
    if schema is True:
        schema = {}
    if schema is False:
        raise ConstraintError("the JSON schema false matches no value")
    if not isinstance(schema, dict):
        raise ConstraintError("a JSON schema must be an object (or true)")
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False))  # key order kept: it orders the output


def _choice(value: Any) -> Constraint:
    if not isinstance(value, list) or not value:
        raise ConstraintError("choice must be a non-empty list of strings")
    if not all(isinstance(choice, str) and choice for choice in value):
        raise ConstraintError("every choice must be a non-empty string")
    if len(value) > MAX_CHOICES:
        raise ConstraintError(f"at most {MAX_CHOICES} choices, got {len(value)}")
    return Constraint("choice", json.dumps(value, ensure_ascii=False))


def _grammar(value: Any) -> Constraint:
    text = _string(value, "grammar")
    if "::=" in text:  # GBNF / EBNF rules
        try:
            text = gbnf_to_lark(text)
        except Exception as error:  # the converter's message is the record's diagnosis
            raise ConstraintError(f"grammar is not valid GBNF: {error}") from error
    return Constraint("grammar", text)


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"{name} must be a non-empty string")
    return value


class ConstraintChecker:
    """Compiles constraints, each distinct one once (an LRU of `max_cached` verdicts). Without a
    tokenizer only the grammar is checked; with one (a Hugging Face tokenizer) the first mask too,
    which finds an empty language."""

    def __init__(self, tokenizer: Any = None, max_cached: int = 1024) -> None:
        self.hf_tokenizer = tokenizer
        self._tokenizer: Any = None
        self.max_cached = max_cached
        self._verdicts: OrderedDict[Constraint, str | None] = OrderedDict()

    def check(self, constraint: Constraint) -> None:
        """Raise `ConstraintError` with the library's message if `constraint` does not compile."""
        if constraint in self._verdicts:
            self._verdicts.move_to_end(constraint)
            error = self._verdicts[constraint]
        else:
            error = self._compile_error(constraint)
            self._verdicts[constraint] = error
            if len(self._verdicts) > self.max_cached:
                self._verdicts.popitem(last=False)
        if error is not None:
            raise ConstraintError(error)

    @property
    def num_cached(self) -> int:
        return len(self._verdicts)

    def _compile_error(self, constraint: Constraint) -> str | None:
        try:
            grammar = constraint.grammar()
        except Exception as error:  # ValueError on a schema that is not JSON
            return f"{constraint.kind} does not compile: {error}"
        if self.hf_tokenizer is None:
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
            return f"{constraint.kind} does not compile: {'; '.join(messages)}" if is_error else None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if not matcher.is_error():
            matcher.compute_bitmask()  # the first mask: an empty language fails here
        if matcher.is_error():
            return f"{constraint.kind} does not compile: {matcher.get_error()}"
        return None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = llguidance_tokenizer(self.hf_tokenizer)
        return self._tokenizer


def llguidance_tokenizer(hf_tokenizer: Any, vocab_size: int | None = None,
                         eos_token_id: int | None = None) -> Any:
    """llguidance's view of a Hugging Face tokenizer, over `vocab_size` ids (the model's output
    layer may be wider than the tokenizer)."""
    import llguidance.hf

    eos = hf_tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size or len(hf_tokenizer), eos_token=eos)
