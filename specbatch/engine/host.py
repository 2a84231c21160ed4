"""This host in words, for keys of what is measured or built per machine (GEMM peaks, pass profiles,
the C kernels, the streamed GEMM's row bounds).

The host name and architecture alone do not tell machines apart: a cloud VM is often named `vm` on
an Intel and an AMD host alike, and `platform.processor()` is empty on Linux, so a cache shared by
both (a home directory on a cluster's file system) would hand one CPU another's measurements, or a
kernel built with `-march=native` for another CPU. The processor's model name tells them apart.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

import torch

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
    """The host, its processor and the vector instructions torch uses on it, or its accelerator."""
    accelerator = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    return " ".join([platform.node(), platform.machine(), accelerator, torch.backends.cpu.get_cpu_capability()])
