"""The benchmarks' shared ``--threads`` option, and what every results file records beside its
figures: the machine and, for a model folder, a path that is no machine's (``recorded_path``).

On a small shared machine PyTorch's default of one intra-op thread per core thrashes: a
second thread waits on its busy sibling at every op, which swamps small ops and makes ratios
swing by 0.1 or more between runs. Every benchmark therefore runs on one thread unless told
otherwise, and records the count it ran with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from aclpipe.host import machine  # noqa: F401  (the benchmarks' machine field, shared with run.json)


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


def recorded_path(path: Path) -> str:
    """``path`` as the results file records it: relative to the working directory, else its
    last parts (``models/<task>/<method>/export``), never an absolute machine path."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(*path.parts[-4:]))
