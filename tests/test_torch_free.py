"""The simulator and the scheduler import no torch: a policy study must run where torch is not
installed (or not wanted). Checked in a fresh interpreter where `import torch` fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    sys.modules["transformers"] = None
    from specbatch.config import load_config
    from specbatch.sim.acceptance import DomainAcceptance
    from specbatch.sim.run import simulate
    from specbatch.sim.workload import DomainMix, UniformLength, Workload

    config = load_config(None, ["capacity.max_context=256", "scheduler.max_batch_rows=4",
                                "scheduler.lookahead=adaptive", "sampling.max_new_tokens=16"])
    workload = Workload(DomainMix((("code", 1.0),)), UniformLength(4, 40), UniformLength(1, 16), 16)
    summary = simulate(config, workload.draw(40, seed=3), DomainAcceptance({"code": (0.7, 10.0)}, seed=1),
                       sys.argv[1])
    assert summary.num_completed == 40, summary
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers")
                    and sys.modules[name] is not None)
    assert not loaded, loaded
    print("ok", summary.num_completed)
""")


def test_simulator_runs_without_torch(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "sim")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok 40"
