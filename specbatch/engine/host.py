"""This host in words, for keys of what is measured or built per machine (GEMM peaks, pass profiles,
the C kernels, the streamed GEMM's row bounds), and the cache of what is measured once per machine.

The host name and architecture alone do not tell machines apart: a cloud VM is often named `vm` on
an Intel and an AMD host alike, and `platform.processor()` is empty on Linux, so a cache shared by
both (a home directory on a cluster's file system) would hand one CPU another's measurements, or a
kernel built with `-march=native` for another CPU. Nor does the processor's model name alone: VMs
on AMD EPYC Zen 4 (family 25) and Zen 5 (family 26) hosts both report `AMD EPYC`, and the Zen 5
ran float32 GEMMs at 2.4x and bfloat16 at 1.6x the Zen 4's, with instructions the Zen 4 lacks. So
the key is the model name with the family, model and a digest of the instruction-set flags.
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
    """The processor's model name with its family, model and a digest of its flags ('AMD EPYC
    (family 26 model 2 flags 3f0a…)'), or the platform's word for it where /proc/cpuinfo does not say."""
    try:
        first = CPUINFO.read_text().split("\n\n", 1)[0]  # the first processor's block
    except OSError:
        first = ""
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""  # x86 says flags, Arm says Features
    details = [f"family {fields['cpu family']}" if "cpu family" in fields else "",
               f"model {fields['model']}" if "model" in fields else "",
               f"flags {hashlib.sha256(' '.join(sorted(flags.split())).encode()).hexdigest()[:8]}" if flags else ""]
    details = [detail for detail in details if detail]
    return f"{name} ({' '.join(details)})" if details else name


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
