"""specbatch: offline batch inference with exact, batched speculative decoding."""

import os

# torch's CPU allocator puts allocations of 2 MB and more (the weights' panels, the KV pools) on
# transparent huge pages when this is set before its first allocation: the CLI, its workers and the
# vLLM peer it starts import specbatch (or inherit the setting) before torch allocates. A pass reads
# every weight and, shuffled across blocks, every row's KV: one TLB entry per 2 MB instead of per
# 4 KB took 1-5% off SmolLM2's bfloat16 decoding passes at 1-32 rows on an AMD EPYC (float32 0-7%;
# benchmarks/huge_pages_ab.py). THP_MEM_ALLOC_ENABLE=0 keeps 4 KB pages.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
