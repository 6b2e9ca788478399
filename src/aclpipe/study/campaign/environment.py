"""Where a run ran (``run.json``'s ``environment``): the device, the CPU and the software stack."""

from __future__ import annotations


def environment(device: str) -> dict[str, str]:
    """Where a run ran: the same seed gives other weights on another device or library, and
    another speed on another CPU (``cpu``: its name, from /proc/cpuinfo)."""
    import platform

    import torch
    import transformers

    from aclpipe.host import cpu_name

    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda) if device == "cuda" else "none",
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
