"""Scratch folders of `serve --workers` under the temp directory, and their clean-up.

Each folder holds a lock file its supervisor keeps locked (flock) for its whole life; the
kernel drops the lock with the process however it ends. A supervisor that was SIGKILLed never
reaches its own clean-up, so the next one removes every folder whose lock it can take. Locks,
unlike process ids, are not reused, and hold across PID namespaces (in a container every
supervisor may be pid 1) and between processes sharing one /tmp.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

PREFIX: Final = "tiergate-"
LOCK_NAME: Final = ".tiergate-lock"


@contextlib.contextmanager
def scratch_dir(kind: str, root: Path | None = None) -> Iterator[Path]:
    """A fresh folder `<temp>/tiergate-<kind>-*`, locked while the block runs, removed after."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=root))
    # Locked under a temporary name, then renamed: a clean-up never sees the lock file of a
    # folder before it is locked.
    partial = folder / f"{LOCK_NAME}.partial"
    lock = os.open(partial, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        partial.rename(folder / LOCK_NAME)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


def remove_orphaned_scratch(root: Path | None = None) -> list[Path]:
    """Removes the scratch folders whose supervisor is gone (their lock is free); folders
    without a lock file are not ours and stay. Returns what it removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            lock = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its supervisor is alive
            os.close(lock)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)
        removed.append(folder)
    return removed


__all__ = ["LOCK_NAME", "PREFIX", "remove_orphaned_scratch", "scratch_dir"]
