"""Child processes that never outlive specbatch: each leads its own session (a terminal's Ctrl-C reaches
only the parent, which decides how to stop them), gets SIGTERM from the kernel if the parent dies
(PR_SET_PDEATHSIG, Linux; even on `kill -9`), and is stopped by its process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

POLL_S = 0.1


def spawn(command: Sequence[str], env: dict[str, str], output: IO[bytes] | int, cwd: Path | None = None
          ) -> subprocess.Popen:
    return subprocess.Popen(list(command), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def signal_groups(processes: Sequence[subprocess.Popen], sig: int) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, sig)  # each leads its own session: group id = its pid
        except (ProcessLookupError, PermissionError):
            continue


def stop_groups(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the groups still running, SIGKILL them after `grace_s` (also any grandchild left)."""
    running = [p for p in processes if p.poll() is None]
    if not running:
        return
    signal_groups(running, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    signal_groups(running, signal.SIGKILL)
    for process in running:
        process.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, num_lines: int = 20) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-num_lines:])
