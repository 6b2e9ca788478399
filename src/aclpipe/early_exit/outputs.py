"""Where ``aclpipe predict``'s records go: one JSON line each, to stdout or to a file written
atomically, with the output path checked before the model loads (``early_exit.predict``)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from aclpipe.atomic import atomic_path
from aclpipe.errors import UserError


def check_output(path: Path) -> None:
    """A one-line ``UserError`` unless ``path`` can become the output file: not a folder, in
    a folder that exists (or can be made) and that this process may write."""
    if path.is_dir():
        raise UserError(
            f"--output {path} is a folder: give a file path, such as {path / 'predictions.jsonl'}"
        )
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(
            f"--output {path} cannot be written: {parent} is a file, not a folder; give a path "
            "in a folder"
        )
    try:  # a probe, as the atomic write will make its temporary file there
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=parent)
    except OSError as err:
        raise UserError(
            f"--output {path} cannot be written: {parent} takes no new file "
            f"({err.strerror or type(err).__name__}); give a path in a folder you can write, "
            "or - for stdout"
        ) from None
    os.close(fd)
    os.unlink(probe)


def write_records(rows: Iterable[dict], out: TextIO | Path) -> None:
    """``write_jsonl``, with a write that fails on the way (a full disk, a folder gone) one
    line naming the output; the atomic write leaves nothing half-written."""
    try:
        write_jsonl(rows, out)
    except OSError as err:
        if isinstance(out, Path):
            raise UserError(
                f"--output {out} cannot be written ({err.strerror or type(err).__name__}): "
                "give another path, or - for stdout"
            ) from None
        raise


def write_jsonl(rows: Iterable[dict], out: TextIO | Path | str) -> int:
    """Write one JSON object per line; return how many.

    ``out`` is an open text stream (stdout) or a path. A path is written atomically
    (``atomic.atomic_path``): rows go to a temporary file beside it, renamed into place only
    when every row is written, with the usual mode (0644 under umask 022).
    """
    if not isinstance(out, (str, Path)):
        count = 0
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        out.flush()
        return count
    with atomic_path(Path(out)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        count = write_jsonl(rows, f)
        os.fsync(f.fileno())
    return count
