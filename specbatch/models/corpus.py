"""Documents for the bundled demo pair, built from text every Python install has.

Code documents are the top-level functions and classes of the standard library; prose documents
are the help topics of `pydoc_data.topics`. Each document ends in EOS during training, so the
models learn to stop at natural ends. A stable hash puts 5% of code and 10% of prose in a held-out
split used for evaluation, the model card and the benchmark prompts.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Domain = Literal["code", "prose"]
Split = Literal["train", "heldout"]

HELDOUT_PERCENT = {"code": 5, "prose": 10}
MAX_DOC_CHARS = 6000
SKIPPED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "ensurepip"}


@dataclass(frozen=True)
class Document:
    doc_id: str
    domain: Domain
    text: str


def split_of(doc: Document) -> Split:
    digest = int(hashlib.sha256(doc.doc_id.encode()).hexdigest()[:8], 16)
    return "heldout" if digest % 100 < HELDOUT_PERCENT[doc.domain] else "train"


def code_documents(stdlib: Path | None = None) -> Iterator[Document]:
    """One document per top-level function or class of each stdlib module, in a stable order."""
    root = stdlib or Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for name, text in _definitions(source.splitlines(keepends=True), tree.body):
            yield Document(f"code:{path.relative_to(root)}:{name}", "code", text)


def _definitions(lines: list[str], body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Functions and classes; a class too long to be one document yields its methods instead."""
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        text = textwrap.dedent("".join(lines[first - 1 : node.end_lineno])).rstrip()
        name = prefix + node.name
        if 40 <= len(text) <= MAX_DOC_CHARS:
            yield name, text
        elif isinstance(node, ast.ClassDef):
            yield from _definitions(lines, node.body, prefix=f"{name}.")


def prose_documents() -> Iterator[Document]:
    """One document per help topic, split at blank-line paragraphs into chunks of bounded size."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        for index, chunk in enumerate(_paragraph_chunks(topics[name].strip())):
            yield Document(f"prose:{name}:{index}", "prose", chunk)


def _paragraph_chunks(text: str, max_chars: int = 800) -> Iterator[str]:
    chunk: list[str] = []
    size = 0
    for paragraph in text.split("\n\n"):
        if chunk and size + len(paragraph) > max_chars:
            yield "\n\n".join(chunk)
            chunk, size = [], 0
        chunk.append(paragraph)
        size += len(paragraph) + 2
    if chunk:
        yield "\n\n".join(chunk)


def documents(domain: Domain, split: Split) -> list[Document]:
    source = code_documents() if domain == "code" else prose_documents()
    return [doc for doc in source if split_of(doc) == split]
