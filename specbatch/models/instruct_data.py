"""Chat-templated prompts for an instruct target, built from the corpus (`corpus.py`).

A drafter meets the target's answers to user requests while serving, so its training data and the
benchmark's held-out prompts are both built here: "code" tasks over the first lines of a code
document (continue, explain, document, review) and "chat" tasks over a prose passage (summarize,
answer, continue, explain). Training uses the train split, the benchmark the held-out split, with
the same builder. Deterministic: documents sorted by id, shuffled by a `random.Random` seeded with
(seed, domain, split), each prompt's excerpt and task drawn by one seeded with its index; no `hash()`.
"""

from __future__ import annotations

import random
from typing import Literal

from transformers import PreTrainedTokenizerBase

from specbatch.models.corpus import Document, Split, documents

InstructDomain = Literal["code", "chat"]

CODE_TASKS = (
    "Continue this Python code:\n\n```python\n{text}\n```",
    "Explain what this Python code does:\n\n```python\n{text}\n```",
    "Write a docstring for this Python code and show the code with it:\n\n```python\n{text}\n```",
    "Review this Python code and suggest one improvement:\n\n```python\n{text}\n```",
)
CHAT_TASKS = (
    "Summarize the following text in two or three sentences.\n\n{text}",
    "What is the main point of this text? Answer in a few sentences.\n\n{text}",
    "Continue this text with one more paragraph.\n\n{text}",
    "Explain the following to a beginner programmer.\n\n{text}",
    "Write a question a reader might ask about this text, then answer it.\n\n{text}",
)
MIN_CODE_LINES, MAX_CODE_LINES = 4, 16
MAX_EXCERPT_CHARS = 900  # prompts stay short: a 135M target prefills ~4.5 ms per token on one core


def instruct_prompts(tokenizer: PreTrainedTokenizerBase, domain: InstructDomain, split: Split, num_prompts: int,
                     seed: int = 0) -> list[list[int]]:
    """`num_prompts` user requests of `domain` over `split` documents, as token ids with the chat
    template applied (add_generation_prompt=True). Each document is used once before any is used
    again (with another excerpt length or task)."""
    return [_apply_template(tokenizer, text) for text in instruct_texts(domain, split, num_prompts, seed)]


def instruct_texts(domain: InstructDomain, split: Split, num_prompts: int, seed: int = 0) -> list[str]:
    """The user messages of `instruct_prompts`, before the chat template; the first n of a longer list
    are the n of a shorter one."""
    docs = sorted(documents("code" if domain == "code" else "prose", split), key=lambda doc: doc.doc_id)
    order = list(range(len(docs)))
    random.Random(f"{seed}:{domain}:{split}").shuffle(order)  # a str seed is hashed by SHA-512: stable
    tasks = CODE_TASKS if domain == "code" else CHAT_TASKS
    texts = []
    for index in range(num_prompts):
        rng = random.Random(f"{seed}:{domain}:{split}:{index}")
        doc = docs[order[index % len(docs)]]
        excerpt = _code_excerpt(doc, rng) if domain == "code" else _cut(doc.text)
        texts.append(rng.choice(tasks).format(text=excerpt))
    return texts


def _code_excerpt(doc: Document, rng: random.Random) -> str:
    """The document's first lines (its signature, docstring and first statements)."""
    lines = doc.text.splitlines()[: rng.randint(MIN_CODE_LINES, MAX_CODE_LINES)]
    return _cut("\n".join(lines))


def _cut(text: str) -> str:
    """At most MAX_EXCERPT_CHARS, ending at a line break when there is one."""
    if len(text) <= MAX_EXCERPT_CHARS:
        return text
    head = text[:MAX_EXCERPT_CHARS]
    return head[: head.rfind("\n")] if "\n" in head else head


def _apply_template(tokenizer: PreTrainedTokenizerBase, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
