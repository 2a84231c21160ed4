"""A real S3-compatible server for the tests: `moto`'s server mode on 127.0.0.1 (a free port), in its
own process group, with the credentials and endpoint in the environment (`AWS_*`), the way a user
points specbatch at an object store."""

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


def _wait_up(url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "moto server exited"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("moto server did not start")
