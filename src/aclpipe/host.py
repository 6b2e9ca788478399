"""The machine a run or a measurement ran on: its CPU, as /proc/cpuinfo names it.

Two hosts with one library stack train to the same scores but not at the same speed, and a
run's record that names only "cpu" cannot say which host a timing came from (this project's
runs have been made on an Intel Xeon and on an AMD EPYC).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
L3_CACHE = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo; empty where there is none (macOS)."""
    try:
        lines = CPUINFO.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip() and fields:
            break  # the first processor's block is enough: the others repeat it
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name(fields: dict[str, str] | None = None) -> str:
    """``AMD EPYC 7B13 (family 25, model 1)`` from /proc/cpuinfo (or its ``fields``, read
    once by the caller); elsewhere what ``platform`` knows (``arm``, ``x86_64``), never empty."""
    fields = _cpuinfo() if fields is None else fields
    if fields.get("model name"):
        return f"{fields['model name']} (family {fields.get('cpu family')}, model {fields.get('model')})"
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict:
    """The CPU a ratio was measured on (the benchmarks' ``machine`` field): engines' ratios
    differ between hosts (on one 2-core host ONNX Runtime ran MiniLM 1.75x faster than PyTorch
    at batch 32, on another the same)."""
    info: dict = {"machine": platform.machine(), "cores": os.cpu_count()}
    fields = _cpuinfo()
    if not fields:
        return info
    info["cpu"] = cpu_name(fields)
    flags = set(fields.get("flags", "").split())
    info["isa"] = [f for f in ISA_FLAGS if f in flags]
    try:
        info["l3_cache"] = L3_CACHE.read_text(encoding="utf-8").strip()
    except OSError:
        pass
    return info
