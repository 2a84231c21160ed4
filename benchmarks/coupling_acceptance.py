"""Draft acceptance of the two sampling couplings on the bundled pair (`sampling.coupling`).

Counts, not timings: per temperature and coupling, the share of proposed drafts accepted and the
committed tokens per verified row, on the same held-out prompts with the same seeds.

    .venv/bin/python benchmarks/coupling_acceptance.py [--prompts 48] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import dataclasses

from specbatch.config import load_config
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.lab.prompts import heldout_prompts
from specbatch.loop import MemoryRecorder, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    models = load_models(load_config())
    prompts = heldout_prompts(models.tokenizer, args.prompts, args.max_new_tokens)
    print(f"bundled pair, draft fixed:4, {args.prompts} held-out prompts, max_new_tokens ≤ {args.max_new_tokens}")
    print("temperature  coupling   accepted/proposed  committed/verified row")
    for temperature in (0.7, 1.0):
        for coupling in ("rejection", "gumbel"):
            config = load_config(None, [f"sampling.coupling={coupling}", "scheduler.lookahead=fixed:4"])
            recorder = MemoryRecorder()
            engine = build_hf_engine(config, models, recorder)
            rows = []
            for index, prompt in enumerate(prompts):
                row = prompt.to_row()
                row.params = dataclasses.replace(row.params, temperature=temperature, seed=index)
                rows.append(row)
            generate(engine, rows)
            proposed = sum(r.num_proposed for r in recorder.rounds)
            accepted = sum(r.num_accepted for r in recorder.rounds)
            verified = sum(r.num_decode_rows for r in recorder.rounds)
            committed = sum(r.num_committed for r in recorder.rounds)
            print(f"{temperature:11.1f}  {coupling:9}  {accepted / proposed:17.3f}  {committed / verified:22.3f}")


if __name__ == "__main__":
    main()
