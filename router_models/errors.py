"""The router's exception tree.

```
RouterError                 every failure this package raises on purpose
├── LabelDataError          a label file is missing, empty or malformed (names file and line)
├── ModelFormatError        a model directory is missing, incomplete or of an unknown version
└── TierError               tier names or costs that do not fit the ladder or the model
```

The CLI turns each of these into a one-line message and exit code 2; anything else is a bug.
"""

from __future__ import annotations

__all__ = ["LabelDataError", "ModelFormatError", "RouterError", "TierError"]


class RouterError(Exception):
    """Base class of every error the router raises on purpose."""


class LabelDataError(RouterError):
    """A label file cannot be used; the message names the file and, where known, the line."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.detail = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class ModelFormatError(RouterError):
    """A model directory cannot be loaded."""


class TierError(RouterError):
    """Tier names, ladder order or costs are inconsistent."""
