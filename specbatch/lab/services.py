"""Services the object-store tests and `benchmarks/pool_bench.py` start on this machine: an
S3-compatible server (`moto`'s server mode, a test extra) and a Prefect server, each on 127.0.0.1 (a
free port), in its own process group, stopped when the block ends. The S3 credentials and endpoint go
into the environment (`AWS_*`), the way a user points specbatch at an object store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from s3fs import S3FileSystem

from specbatch.job.processes import free_port, stop_groups


@contextmanager
def s3_server(log: Path) -> Iterator[dict[str, str]]:
    """Start the server; yields the environment variables that reach it (also set in os.environ)."""
    port = free_port()
    with log.open("ab") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {key: os.environ.get(key) for key in env}
    try:
        _wait_up(env["AWS_ENDPOINT_URL"], server)
        os.environ.update(env)
        S3FileSystem.clear_instance_cache()  # a client made for an earlier server's port
        yield env
    finally:
        S3FileSystem.clear_instance_cache()
        stop_groups([server], grace_s=5)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_bucket(name: str) -> str:
    S3FileSystem().mkdir(name)
    return f"s3://{name}"


@contextmanager
def prefect_server(home: Path) -> Iterator[dict[str, str]]:
    """`prefect server start` with its state in HOME; yields the environment that reaches it."""
    port = free_port()
    env = {"PREFECT_HOME": str(home), "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "1", "PREFECT_UI_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1"}
    home.mkdir(parents=True, exist_ok=True)
    prefect = str(Path(sys.executable).with_name("prefect"))
    with (home / "server.log").open("ab") as out:
        server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_up(f"{env['PREFECT_API_URL']}/health", server, timeout_s=180)
        yield env
    finally:
        stop_groups([server], grace_s=30)


def _wait_up(url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{server.args!r} exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing answered at {url} within {timeout_s:.0f} s")
