"""A frequency-counted index of every substring (up to `max_depth` tokens) of the sequences put in it:
the suffix drafter's memory of what the job has produced (SuffixDecoding, Oliaro et al. 2024).

The index is a trie of the substrings that start at each position of each sequence, cut at
`max_depth` tokens: a node's count is how many times its path occurs. Any substring of an indexed
substring is indexed too, so if the last m tokens of a context occur, so do its last m − 1; the
longest matching suffix is found by bisection. Continuations are ranked by count, and a token's
probability is estimated as its node's count over its parent's.

Sequences grow one token at a time (a running row's own tokens) and leave in the order they came
(the job-wide index forgets its oldest sequences past `max_tokens`): nodes never exceed
`max_depth` × the tokens indexed, whatever the length of the job.

A row whose prompt starts with a block other rows share (an instruction, a few-shot block) need not
index it again: `PrimedSuffixIndex` holds only the substrings that end after the shared prefix and
drafts over the union with the prefix's index (counts summed), which is the index of the whole
sequence, node for node and count for count, so its drafts are the same (tests/test_suffix_index.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass


class _Node:
    """A trie node: most are leaves, so a node has no children dict until it gets a child."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] | None = None


@dataclass
class SuffixDraft:
    """A proposed continuation, the probability estimate of each of its tokens, and the length of
    the context suffix it was matched on."""

    token_ids: list[int]
    probs: list[float]
    match_len: int

    @property
    def score(self) -> float:
        """Expected accepted tokens, if the estimates were right (SuffixDecoding's ranking)."""
        return sum(self.probs)


class SuffixIndex:
    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ValueError(f"a suffix index needs max_depth >= 2, not {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self.num_nodes = 0
        self.num_tokens = 0  # tokens of the sequences indexed

    def add(self, token_ids: list[int]) -> None:
        """Index one whole sequence."""
        created = 0
        for start in range(len(token_ids)):
            node = self.root
            for token in token_ids[start : start + self.max_depth]:
                node, made = _count_child(node, token)
                created += made
        self.num_nodes += created
        self.num_tokens += len(token_ids)

    def remove(self, token_ids: list[int]) -> None:
        """Un-index a sequence `add` indexed; nodes no sequence reaches any more are dropped."""
        for start in range(len(token_ids)):
            node = self.root
            for token in token_ids[start : start + self.max_depth]:
                assert node.children is not None
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    self.num_nodes -= _size(child)
                    del node.children[token]
                    break
                node = child
        self.num_tokens -= len(token_ids)

    def draft(self, context: list[int], max_tokens: int, min_prob: float, spec_factor: float) -> SuffixDraft:
        """The likeliest continuation of `context`'s longest indexed suffix: at most `max_tokens`
        tokens, at most `spec_factor` × the match length (a short match is weak evidence), and only
        while the estimated probability of the whole continuation stays at least `min_prob`."""
        return draft_from([self.root], self.max_depth, context, max_tokens, min_prob, spec_factor)


def draft_from(roots: list[_Node], max_depth: int, context: list[int], max_tokens: int, min_prob: float,
               spec_factor: float) -> SuffixDraft:
    """`SuffixIndex.draft` over the union of tries (a node's count the sum of its counts in each; ties
    between continuations go to the one first indexed, as in one trie)."""
    if max_tokens <= 0:
        return SuffixDraft([], [], 0)
    longest = min(len(context), max(1, max_depth - max_tokens))  # leave the match room to continue
    match_len = bisect_left(range(1, longest + 1), True, key=lambda m: not _walk(roots, context[-m:]))
    nodes = _walk(roots, context[len(context) - match_len :]) if match_len else []
    draft = SuffixDraft([], [], match_len)
    limit = min(max_tokens, int(spec_factor * match_len), max_depth - match_len)
    prob = 1.0
    while nodes and len(draft.token_ids) < limit:
        counts: dict[int, int] = {}
        for node in nodes:
            for token, child in (node.children or {}).items():
                counts[token] = counts.get(token, 0) + child.count
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)
        prob *= counts[token] / sum(node.count for node in nodes)
        if prob < min_prob:
            break
        draft.token_ids.append(token)
        draft.probs.append(prob)
        nodes = [node.children[token] for node in nodes if node.children and token in node.children]
    return draft


def _walk(roots: list[_Node], tokens: list[int]) -> list[_Node]:
    """The nodes of `tokens`' path in each trie that has it (empty: no trie has it)."""
    found = []
    for node in roots:
        for token in tokens:
            child = node.children.get(token) if node.children else None
            if child is None:
                break
            node = child
        else:
            found.append(node)
    return found


def _child(node: _Node, token: int) -> tuple[_Node, int]:
    """`node`'s child for `token`, created (count 0: a path held for what extends it) if new (then 1,
    else 0). Only priming lays paths uncounted, a few dozen tokens a row: not the hot loop."""
    if node.children is None:
        node.children = {}
    made = token not in node.children
    return node.children.setdefault(token, _Node()), int(made)


def _count_child(node: _Node, token: int) -> tuple[_Node, int]:
    """`node`'s child for `token`, created if new (then 1, else 0), its count raised by one. The index's
    hot loop (a suffix drafter indexes every prompt and committed token `max_depth` times): one
    function, no method lookups."""
    children = node.children
    if children is None:
        children = node.children = {}
    child = children.get(token)
    if child is None:
        child = children[token] = _Node()
        child.count = 1
        return child, 1
    child.count += 1
    return child, 0


def _size(node: _Node) -> int:
    """Nodes in the subtree under and including `node`."""
    return 1 + sum(_size(child) for child in (node.children or {}).values())


class GrowingSuffixIndex(SuffixIndex):
    """The index of one sequence that grows by appended tokens (a running row's prompt and output):
    each token extends the paths of the last `max_depth` starts, so an append costs `max_depth` steps."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(max_depth)
        self.frontier: list[_Node] = []  # the path ends of the last max_depth − 1 starts

    def extend(self, token_ids: list[int], counted: bool = True) -> None:
        """Append tokens; uncounted (`PrimedSuffixIndex`), their paths are only laid for later tokens."""
        frontier, root, created, longest = self.frontier, self.root, 0, self.max_depth - 1
        step = _count_child if counted else _child
        for token in token_ids:
            frontier.append(root)
            ends = []
            for node in frontier:
                child, made = step(node, token)
                created += made
                ends.append(child)
            if len(ends) > longest:  # that start's substring is max_depth long: it ends here
                del ends[0]
            frontier = ends
        self.frontier = frontier
        self.num_nodes += created
        self.num_tokens += len(token_ids)


class PrimedSuffixIndex(GrowingSuffixIndex):
    """The index of a sequence that starts with a prefix indexed elsewhere (`prefix`, a shared
    `GrowingSuffixIndex` of exactly those tokens): it counts only the substrings that end after the
    prefix. Its paths through the prefix's last max_depth − 1 tokens are laid with count 0, so that the
    substrings starting there and ending later extend them; drafts read the union of both tries."""

    def __init__(self, prefix: GrowingSuffixIndex, prefix_tokens: list[int]) -> None:
        super().__init__(prefix.max_depth)
        self.prefix = prefix
        self.extend(prefix_tokens[max(0, len(prefix_tokens) - self.max_depth + 1) :], counted=False)
        self.num_tokens = len(prefix_tokens)  # of the sequence: the prefix is held, if not here

    def draft(self, context: list[int], max_tokens: int, min_prob: float, spec_factor: float) -> SuffixDraft:
        return draft_from([self.prefix.root, self.root], self.max_depth, context, max_tokens, min_prob, spec_factor)


class BoundedSuffixIndex(SuffixIndex):
    """A job-wide index of whole sequences that forgets the oldest once it holds over `max_tokens`."""

    def __init__(self, max_depth: int, max_tokens: int) -> None:
        super().__init__(max_depth)
        self.max_tokens = max_tokens
        self.sequences: deque[list[int]] = deque()

    def add(self, token_ids: list[int]) -> None:
        token_ids = token_ids[-self.max_tokens :]
        super().add(token_ids)
        self.sequences.append(token_ids)
        while self.num_tokens > self.max_tokens:
            self.remove(self.sequences.popleft())
