"""The shadow label log: append-only JSONL in the canonical label format, rotated by size.

One line per label, as MANIFEST.md defines the format (`tiergate router train --data`
reads it directly):
    {"id", "correct": {"<tier>": null, ..., "<judged tier>": 0|1, "<top tier>": 1},
     "source": "shadow:<tenant>", "shadow": {"tenant", "at", "judge", "p"},
     "request": {...} (only where the tenant allows raw text) | "features": {...}}
`correct` is relative: 1 for the judged tier means it agreed with the top tier (the
reference), so the top tier is 1 by definition; these lines train the default relative
label, not `--label absolute`. Without raw text a line carries the request's surface
features instead of the request.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Any

import orjson


class LabelLog:
    """Appends lines to `path`; past `max_bytes` it rotates to path.1 ... path.N (with no
    backups, it truncates `path`)."""

    def __init__(self, path: Path, max_bytes: int = 64 * 1024 * 1024, backups: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.written = 0
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        # Fail now, where a configuration can still be refused, not at the first label.
        path.parent.mkdir(parents=True, exist_ok=True)
        _open_private(path).close()

    def append(self, record: dict[str, Any]) -> None:
        line = orjson.dumps(record) + b"\n"
        with self._lock:
            file = self._open()
            # The file's size, not this handle's position: other workers append to it too.
            size = os.fstat(file.fileno()).st_size
            if size + len(line) > self.max_bytes and size > 0:
                self._rotate()
                file = self._open()
            file.write(line)
            file.flush()
            self.written += 1

    def _open(self) -> IO[bytes]:
        if self._file is not None and not self._is_current(self._file):
            # Another worker (`serve --workers N`) rotated the file: appending to the old one
            # would write into a backup, and after `backups` more rotations into a deleted file.
            self._file.close()
            self._file = None
        if self._file is None:
            self._file = _open_private(self.path)
        return self._file

    def _is_current(self, file: IO[bytes]) -> bool:
        try:
            on_disk = self.path.stat()
        except FileNotFoundError:
            return False
        held = os.fstat(file.fileno())
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for index in range(self.backups, 0, -1):
            source = (
                self.path.with_name(f"{self.path.name}.{index - 1}") if index > 1 else self.path
            )
            target = self.path.with_name(f"{self.path.name}.{index}")
            if source.exists():
                source.replace(target)
        if self.backups == 0:
            # Nowhere to move the full file to: start it again, or it would grow without bound.
            self.path.open("wb").close()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _open_private(path: Path) -> IO[bytes]:
    """`path` opened for appending; created readable by its owner alone: a line may hold a
    tenant's prompt (keep_text), and under the usual umask a new file is world-readable.
    An existing file keeps the mode it has."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "ab")


def check_label_log_path(path: Path) -> None:
    """Raises OSError when `LabelLog(path)` could not create or append to `path`, without
    creating anything: a configuration check must leave the file system as it found it."""
    path = path.resolve()  # a symbolic link is checked where LabelLog would write: its target
    if path.exists():
        if path.is_dir():
            raise IsADirectoryError(f"label log {path} is a directory")
        if not os.access(path, os.W_OK):
            raise PermissionError(f"label log {path} is not writable")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:  # LabelLog makes them
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"label log {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"label log {path}: cannot create entries in {ancestor}")


__all__ = ["LabelLog", "check_label_log_path"]
