"""The instruct prompts the SmolLM2 drafters train on and the benchmark holds out: the same ids on
every call, a longer list extends a shorter one, the chat template applied with the assistant's
turn opened."""

from __future__ import annotations

from conftest import make_tokenizer

from specbatch.models.instruct_data import CHAT_TASKS, CODE_TASKS, instruct_prompts, instruct_texts

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _chat_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_the_same_prompts_every_time_and_a_longer_list_extends_a_shorter_one():
    tokenizer = _chat_tokenizer()
    prompts = instruct_prompts(tokenizer, "chat", "heldout", 12, seed=3)
    assert prompts == instruct_prompts(tokenizer, "chat", "heldout", 12, seed=3)
    assert instruct_prompts(tokenizer, "chat", "heldout", 5, seed=3) == prompts[:5]
    assert prompts != instruct_prompts(tokenizer, "chat", "heldout", 12, seed=4)
    assert instruct_prompts(tokenizer, "chat", "train", 12, seed=3) != prompts
    text = tokenizer.decode(prompts[0])
    assert text.startswith("<user>") and text.endswith("\n<assistant>")


def test_each_prompt_is_a_task_over_an_excerpt():
    chat = instruct_texts("chat", "heldout", 100)  # more than the split's documents: they are reused
    assert all(any(text.startswith(task.split("{text}")[0]) for task in CHAT_TASKS) for text in chat)
    code = instruct_texts("code", "heldout", 4)
    assert all(any(text.startswith(task.split("{text}")[0]) for task in CODE_TASKS) for text in code)
    assert all("```python\n" in text and (text.count("\n") <= 24) for text in code)
