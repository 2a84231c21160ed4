"""Prefect for `specbatch submit` without a deployment: nothing to set up, nothing printed.

The settings go into `os.environ` *before* prefect is imported (prefect reads its logging setup and
analytics switches at import). Two cases:

- `PREFECT_API_URL` is set in the environment: the run reports to that server, as any Prefect user
  expects; only Prefect's console logging is silenced (the CLI prints the progress and summary).
- otherwise the run is isolated: a temporary local Prefect server for this one command, with its
  state in `OUTPUT/.prefect` (a SQLite database of flow runs, logs and artifacts, kept between runs
  so that its schema is created once; no job depends on it, delete it at any time) or in
  `SPECBATCH_PREFECT_HOME` when that is set, the user's own profiles ignored, server analytics and
  SDK telemetry off.

The temporary server is Prefect's own ephemeral server (the command `SubprocessASGIServer` runs in
prefect 3), started here rather than by prefect so that it boots while the CLI imports torch, leads
its own session (a terminal's Ctrl-C stops the job gracefully while the server records the final
state) and dies with the CLI even on `kill -9` (see `specbatch.job.processes`).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from specbatch.job.processes import free_port, spawn, stop_groups, tail

STARTUP_TIMEOUT_S = 120.0
TEMPORARY_SERVER_ENV = "SPECBATCH_TEMPORARY_PREFECT"  # "1" while PREFECT_API_URL names the temporary server

QUIET = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",  # Prefect's console handler (root logger too)
    "PREFECT_LOGGING_LOG_PRINTS": "false",
}


def prefect_home(output: Path, environ: Mapping[str, str] | None = None) -> Path:
    """`OUTPUT/.prefect`, or `SPECBATCH_PREFECT_HOME` when set (one database for many output dirs)."""
    environ = os.environ if environ is None else environ
    if environ.get("SPECBATCH_PREFECT_HOME"):
        return Path(environ["SPECBATCH_PREFECT_HOME"]).resolve()
    return Path(output).resolve() / ".prefect"


def local_prefect_env(output: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to set for a local run whose job directories go under `output`."""
    environ = os.environ if environ is None else environ
    quiet = {key: environ.get(key, value) for key, value in QUIET.items()}
    if environ.get("PREFECT_API_URL"):
        return quiet
    home = prefect_home(output, environ)
    return {
        **quiet,
        "PREFECT_HOME": str(home),
        "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
        "PREFECT_API_URL": "",  # set to the local server's address once it is started
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
        "DO_NOT_TRACK": "1",
    }


def apply_local_prefect_env(output: Path, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the variables (before `import prefect`); returns what was set."""
    environ = os.environ if environ is None else environ
    env = local_prefect_env(output, environ)
    if env.get("PREFECT_HOME"):
        Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # prefect makes only the last level
    for key, value in env.items():
        if value:
            environ[key] = value
        else:
            environ.pop(key, None)
    return env


class LocalServer:
    """A temporary Prefect API server on 127.0.0.1 for one command; stopped at exit."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.log_path = self.home / "server.log"
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        """Start booting (returns at once); `wait_ready` blocks until the API answers."""
        spec = importlib.util.find_spec("prefect")  # no `import prefect` yet
        assert spec is not None and spec.origin is not None, "prefect is a dependency"
        prefect_dir = Path(spec.origin).parent
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                   "--log-level", "error", "--lifespan", "on"]
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        with self.log_path.open("wb") as log:
            self.process = spawn(command, env, log)
        atexit.register(self.stop)  # before prefect's own exit hooks, so it runs after they flush logs

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"the local Prefect server did not start:\n{tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the local Prefect server did not answer within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.process is not None:
            stop_groups([self.process], grace_s=5.0)
            self.process = None


def start_local_prefect(output: Path) -> LocalServer | None:
    """Apply the local settings and, unless an API is configured, start the temporary server.

    Call before `import prefect`; call `wait_ready()` on the server before running a flow.
    """
    env = apply_local_prefect_env(output)
    if "PREFECT_HOME" not in env:
        return None
    server = LocalServer(Path(env["PREFECT_HOME"]))
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ[TEMPORARY_SERVER_ENV] = "1"
    server.start()
    return server
