"""Atomic outputs: write to a temporary path beside the target, then rename.

A stage killed midway leaves only a ``.tmp-*`` path, which no stage or DVC takes as output;
the previous complete output stays in place until the new one is whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write (``suffix`` for writers
    that read the format from the name); when the block ends without error, the file gets the
    mode every output has (0666 less the umask: 0644 under umask 022, where ``mkstemp`` makes
    0600) and is renamed onto ``path``. On any error (or interrupt) it is removed and ``path``
    is untouched. The one atomic file writer: text, JSON lines, figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``atomic_path``, with an fsync before the rename)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces ``target`` whole.

    On any error (or interrupt) the temporary folder is removed and ``target`` is untouched.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    old = None
    if target.exists():
        old = target.parent / f".old-{target.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_files(target: Path, last: str | None = None) -> Iterator[Path]:
    """Yield an empty staging folder; on success each entry replaces its namesake in ``target``.

    Unlike ``atomic_dir`` this leaves other entries of ``target`` alone (another stage's
    output may live there, such as ``export/`` beside a trained model). Entries are moved one
    by one with ``os.replace``, ``last`` (the file readers check for) at the end.
    """
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if last is not None and (target / last).exists():
        os.unlink(target / last)  # a reader sees no output rather than a mix of old and new
    entries = sorted(staging.iterdir(), key=lambda p: p.name == last)
    for entry in entries:
        destination = target / entry.name
        if entry.is_dir():
            os.chmod(entry, 0o777 & ~_umask())
            if destination.exists():
                shutil.rmtree(destination)
        os.replace(entry, destination)
    shutil.rmtree(staging, ignore_errors=True)
