"""K-fold over groups of rows: rows of one group (a duplicated request) share a fold, so no
row is scored by a model that saw its twin."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from sklearn.model_selection import KFold


def grouped_kfold(
    groups: NDArray[np.intp], k: int, seed: int
) -> list[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """Shuffled K-fold (train rows, test rows) over the group ids `groups` (0 .. n_groups-1);
    with one row per group, the folds are KFold's over the rows."""
    n_groups = int(groups.max()) + 1 if groups.size else 0
    folds = KFold(k, shuffle=True, random_state=seed).split(np.arange(n_groups))
    return [
        (np.flatnonzero(np.isin(groups, train)), np.flatnonzero(np.isin(groups, test)))
        for train, test in folds
    ]


__all__ = ["grouped_kfold"]
