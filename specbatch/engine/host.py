"""This host in words, for keys of what is measured or built per machine (GEMM peaks, pass profiles,
the C kernels, the streamed GEMM's row bounds), and the cache of what is measured once per machine.

The host name and architecture alone do not tell machines apart: a cloud VM is often named `vm` on
an Intel and an AMD host alike, and `platform.processor()` is empty on Linux, so a cache shared by
both (a home directory on a cluster's file system) would hand one CPU another's measurements, or a
kernel built with `-march=native` for another CPU. The processor's model name tells them apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")


@cache
def cpu_name() -> str:
    """The processor's model name ('AMD EPYC', 'Intel(R) Xeon(R) Platinum 8480+'), or the
    platform's word for it where /proc/cpuinfo does not say."""
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """The host, its processor and the vector instructions torch uses on it, and its accelerator if any
    (a GPU host's CPU kernels and CPU measurements still depend on its processor)."""
    accelerator = [torch.cuda.get_device_name()] if torch.cuda.is_available() else []
    return " ".join([platform.node(), platform.machine(), cpu_name(), *accelerator,
                     torch.backends.cpu.get_cpu_capability()])


def measured_once(directory: Path, what: str, measure: Callable[[], float]) -> tuple[float, bool]:
    """(value, read back): `measure()` of `what` on this machine, read back from `directory` where a
    process here measured it, else measured and written there. The write is atomic (workers may
    measure at once, each renaming a whole file); a folder that cannot be written keeps the value
    for this process and logs (the next one measures again)."""
    key = f"{machine()}\n{what}"
    path = directory / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            return float(saved["value"]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: measured again
    value = measure()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"key": key, "value": value}, indent=1) + "\n")  # inf as Infinity
        os.replace(temporary, path)
    except OSError as error:
        log.warning("%s is not cached (%s)", what.replace("\n", " "), error)
    return value, False
