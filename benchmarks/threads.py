"""The benchmarks' shared ``--threads`` option.

On a small shared machine PyTorch's default of one intra-op thread per core thrashes: a
second thread waits on its busy sibling at every op, which swamps small ops and makes ratios
swing by 0.1 or more between runs. Every benchmark therefore runs on one thread unless told
otherwise, and records the count it ran with.
"""

from __future__ import annotations

import argparse

import torch


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="PyTorch intra-op threads (0 = torch's default); one by default, see threads.py",
    )


def apply_threads(threads: int) -> int:
    """Set the thread count (0 keeps torch's default); returns the count in force."""
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def machine() -> dict:
    """The CPU a ratio was measured on: engines' ratios differ between hosts (on one 2-core
    host ONNX Runtime ran MiniLM 1.75x faster than PyTorch at batch 32, on another the same)."""
    import os
    import platform

    info = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        lines = open("/proc/cpuinfo", encoding="utf-8").read().splitlines()
    except OSError:
        return info
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    info["cpu"] = (
        f"{fields.get('model name', '')} (family {fields.get('cpu family')}, model {fields.get('model')})"
    )
    info["isa"] = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile") if f in flags]
    try:
        info["l3_cache"] = (
            open("/sys/devices/system/cpu/cpu0/cache/index3/size", encoding="utf-8").read().strip()
        )
    except OSError:
        pass
    return info
