"""A non-editable install is complete: `pip install .` into a fresh venv, then `specbatch report`
on a job from another directory (the wheel carries the top-level sql/ inside the package: setup.py)."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding a wheel-built copy of the project. Its dependencies come from this
    interpreter's site-packages (a plain path line, so this venv's editable hook is not loaded)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    (target / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(REPO)], check=True, capture_output=True, text=True, timeout=600)
    return venv


def test_report_works_from_a_non_editable_install(installed, tmp_path):
    python, specbatch = installed / "bin" / "python", installed / "bin" / "specbatch"
    where = subprocess.run([str(python), "-c", "import specbatch; print(specbatch.__file__)"], cwd=tmp_path,
                           check=True, capture_output=True, text=True).stdout
    assert str(installed) in where and str(REPO) not in where  # the installed copy, not the checkout
    queries = subprocess.run([str(python), "-c", "from specbatch.report import sql_dir; print(sql_dir())"],
                             cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    assert str(installed) in queries  # the wheel's copy of the top-level sql/
    simulated = subprocess.run([str(specbatch), "simulate", "--requests", "30", "--policies", "fcfs",
                                "--output", str(tmp_path / "sim")], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
    assert simulated.returncode == 0, simulated.stderr
    job_dir = next(p for p in (tmp_path / "sim").iterdir() if (p / "results").is_dir())
    report = subprocess.run([str(specbatch), "report", str(job_dir)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stderr
    assert "Throughput versus cost" in (job_dir / "report.md").read_text()
