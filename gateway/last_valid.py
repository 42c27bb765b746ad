"""The last valid configuration, kept by the `serve --workers` supervisor.

Workers reload the config file themselves and refuse an invalid one, so a running gateway
keeps serving through a bad edit. A worker started later (to replace one that died) reads
the file afresh: while the file is invalid it starts from this copy instead of dying at
start-up over and over (and taking the supervisor, and with it the healthy workers, down).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from gateway.file_stamp import FileStamp, file_stamp

log = logging.getLogger("tiergate.workers")


class LastValidConfig:
    """A copy of the config file as it was the last time `validate` accepted it."""

    def __init__(self, source: Path, copy: Path, validate: Callable[[Path], None]) -> None:
        self.source = source
        self.copy = copy
        self._validate = validate
        self._seen: FileStamp | None = None
        self.refresh()

    def refresh(self) -> bool:
        """Re-checks the file if it changed since the last look; True when the copy was
        updated. Whatever `validate` raises about an invalid file keeps the copy as it is."""
        try:
            # As the workers' own watch tells a change (Gateway._watch_config).
            seen = file_stamp(self.source)
        except OSError:
            return False
        if seen == self._seen:
            return False
        self._seen = seen
        partial = self.copy.with_suffix(".partial")
        try:
            # The bytes validated are the bytes kept: validating the source after reading it
            # would pass a half-written file read first if the write ended in between.
            partial.write_bytes(self.source.read_bytes())
            self._validate(partial)
        except Exception as exc:  # any reason the file cannot serve keeps the last good copy
            # The reason names the file as the operator knows it, not the scratch copy.
            reason = str(exc).replace(str(partial), str(self.source))
            log.error(
                "config file %s is not valid, workers keep the last valid one: %s",
                self.source,
                reason,
            )
            return False
        os.replace(partial, self.copy)  # atomic: a starting worker never reads half a file
        return True


__all__ = ["LastValidConfig"]
