"""`specbatch bench --peer vllm`: the same token-id prompts through vLLM, in vLLM's own venv.

vLLM's CPU build pins a transformers release the project's venv cannot share, so it runs as a child
process of the peer's Python (`benchmarks/peer/setup_vllm.sh` makes that venv) on `vllm_runner.py`,
which imports only vLLM: a JSON request in (model paths, prompt ids, batch sizes, modes), token ids
and seconds out. Each (batch size, mode) is one engine; its start-up is timed apart from its
tokens/s, as graph capture is for specbatch's rows. A constrained prompt (issue 42) runs under vLLM's
structured outputs with its llguidance backend and the same grammar, so both engines mask alike.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from specbatch.config import ConfigError, JobConfig
from specbatch.data.constraints import JSON_OPTIONS, Constraint
from specbatch.engine.build import Models, eos_token_ids, kv_bytes_per_token, max_context
from specbatch.engine.gemm_peak import dtype_name
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.model_paths import resolve_dir
from specbatch.lab.prompts import BenchPrompt

RUNNER = Path(__file__).with_name("vllm_runner.py")
PEER_MODES = ("none", "ngram", "draft", "eagle")  # specbatch drafters vLLM runs on the same models


class PeerError(ConfigError):
    """The peer cannot run at all (no venv): exit 2 before anything runs. A mode it refuses is
    reported in its row instead."""


def check_venv(venv: Path) -> Path:
    python = venv.resolve() / "bin" / "python"  # absolute: the runner starts in a temporary directory
    if not python.exists():
        raise PeerError(f"no vLLM venv at {venv}: create it with benchmarks/peer/setup_vllm.sh {venv}")
    return python


def run_vllm(config: JobConfig, models: Models, prompts: list[BenchPrompt], batch_sizes: tuple[int, ...],
             drafters: tuple[str, ...], num_speculative_tokens: int, venv: Path,
             timeout_s: float = 3600, prefix_caching: tuple[bool, ...] = (True,)) -> dict:
    """vLLM's results: {"vllm_version", "results": [{mode, batch_rows, prefix_caching, startup_s, wall_s,
    outputs | error}]}, each mode with vLLM's automatic prefix caching as `prefix_caching` lists."""
    python = check_venv(venv)
    # as a job's slots (engine/build.py): the prompts' longest need, not the model's context, which for
    # a real model (SmolLM2: 8192 positions) would ask vLLM for more KV cache than the machine holds
    need = max(p.num_positions for p in prompts) + max(num_speculative_tokens, 1) + 1
    max_model_len = min(max_context(config, models), need)
    modes = [mode for mode in PEER_MODES if (mode in drafters or mode == "none") and request_has(config, mode)]
    request = {
        "target": str(model_dir(config.models.target)),  # a GGUF: its converted folder, as the engine reads
        "draft": str(model_dir(config.models.draft)) if config.models.draft else None,
        "eagle": str(resolve_dir(config.models.eagle)) if config.models.eagle else None,
        "num_speculative_tokens": max(num_speculative_tokens, 1),
        "ngram_min": config.drafter.ngram_min, "ngram_max": config.drafter.ngram_max,
        "max_model_len": max_model_len, "enforce_eager": False,
        "dtype": dtype_name(next(models.target.parameters()).dtype),  # the engine's: rows and MFU compare alike
        # explicit, because vLLM's CPU build otherwise reserves a fraction of the machine's memory and
        # refuses to start when less is free (as inside a bench that holds the models and HF's batches);
        # every row at full length, twice over (a head's draft layers, block rounding)
        "kv_cache_bytes": max(2 * kv_bytes_per_token(models) * max_model_len * max(batch_sizes), 64 << 20),
        "eos": sorted(eos_token_ids(models)), "batch_sizes": list(batch_sizes),
        "modes": modes, "prefix_caching": list(prefix_caching),
        "prompts": [{"request_id": p.request_id, "prompt_ids": list(p.prompt_ids), "max_new_tokens": p.max_new_tokens,
                     "structured_output": None if p.constraint is None
                     else structured_output(Constraint.from_json(p.constraint))} for p in prompts],
    }
    with tempfile.TemporaryDirectory(prefix="specbatch-peer-") as work:
        request_path, result_path = Path(work) / "request.json", Path(work) / "result.json"
        request_path.write_text(json.dumps(request))
        run = subprocess.run([str(python), str(RUNNER), str(request_path), str(result_path)], cwd=work,
                             capture_output=True, text=True, timeout=timeout_s)
        if not result_path.exists():
            raise PeerError(f"vLLM exited with {run.returncode} before any result: {run.stderr[-2000:]}")
        result = json.loads(result_path.read_text())
    causes = [line for line in run.stderr.splitlines() if "Error" in line and "Traceback" not in line]
    for failed in (r for r in result["results"] if "error" in r):
        failed["error"] += f" ({causes[0].strip()[:300]})" if causes else ""  # the engine's root cause, first seen
    return result


def request_has(config: JobConfig, mode: str) -> bool:
    """Whether the config names the model a peer mode needs (n-gram needs none)."""
    return {"none": True, "ngram": True, "draft": config.models.draft is not None,
            "eagle": config.models.eagle is not None}[mode]


def structured_output(constraint: Constraint) -> dict:
    """vLLM's `StructuredOutputsParams` fields for `constraint`, the grammar llguidance compiles for
    specbatch: JSON without free whitespace and with json.dumps's separators (in the schema's
    `x-guidance`, which overrides vLLM's defaults); a test checks the masks agree step by step."""
    if constraint.kind in ("json_schema", "json_object"):
        return {"json": {**json.loads(constraint.text), "x-guidance": JSON_OPTIONS}}
    if constraint.kind == "choice":
        return {"choice": json.loads(constraint.text)}
    return {constraint.kind: constraint.text}  # regex, grammar (Lark)
