"""What tells that a file changed, for every watch and cache of files the gateway reads."""

from __future__ import annotations

from pathlib import Path

# mtime in ns, size, inode and device. The mtime alone (or with the size) missed a file
# replaced by another with the same mtime (`cp -p` then `mv`, builds that pin mtimes); the
# inode sees a replacement, as it sees a Kubernetes ConfigMap's symlink swap.
FileStamp = tuple[int, int, int, int]


def file_stamp(path: Path) -> FileStamp:
    """The stamp of the file at `path` (following symlinks); raises OSError."""
    status = path.stat()
    return status.st_mtime_ns, status.st_size, status.st_ino, status.st_dev


__all__ = ["FileStamp", "file_stamp"]
