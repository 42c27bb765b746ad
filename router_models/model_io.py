"""Model directories in a safe format: `model.json` (everything small) + `arrays.npz` (weights).

Nothing is ever unpickled: the arrays are read with `numpy.load(allow_pickle=False)`, every
other value is JSON, and shapes are validated while the one-request scorer and the calibration
maps are rebuilt from the state (scikit-learn is not imported for that: the fitted scorer is
rebuilt on first use of the batch path). `model.json` records the SHA-256 of `arrays.npz`, so a
truncated or swapped weights file is refused rather than half-loaded.

```
DIR/model.json      format, version, tiers, label, gram spec, scorer name/params/state,
                    calibration layout, metadata (sources, counts, metrics)
DIR/arrays.npz      scorer__<name> and calibration__x_<k> / calibration__y_<k> arrays
DIR/MODEL_CARD.md   written by training (see card.py); not read back
DIR/report.json     written by training; not read back
DIR/validation.npz  optional (train --cv): out-of-fold probabilities and per-tier scores of the
                    training rows, what a gateway tunes tenant thresholds on (`load_validation`)
```
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from router_models.errors import ModelFormatError
from router_models.isotonic_maps import IsotonicMaps
from router_models.json_out import dumps as strict_dumps
from router_models.lean import lean_from_state
from router_models.model import DeferredScorer, RouterModel
from router_models.ngrams import GramSpec

if TYPE_CHECKING:
    from router_models.scorers import Scorer

__all__ = [
    "ARRAYS_FILE",
    "FORMAT",
    "MODEL_FILE",
    "VALIDATION_FILE",
    "VERSION",
    "load_model",
    "load_validation",
    "model_checksum",
    "save_model",
    "save_validation",
]

FORMAT: Final = "tiergate-router"
VERSION: Final = 1
MODEL_FILE: Final = "model.json"
ARRAYS_FILE: Final = "arrays.npz"
VALIDATION_FILE: Final = "validation.npz"
_SCORER: Final = "scorer__"
_CAL_X: Final = "calibration__x_"
_CAL_Y: Final = "calibration__y_"


def save_model(model: RouterModel, path: str | Path) -> Path:
    """Write `model` into directory `path` (created if needed); returns the directory."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    meta, scorer_arrays = model.scorer.get_state()
    cal = model.calibration
    arrays: dict[str, np.ndarray[Any, Any]] = {f"{_SCORER}{k}": v for k, v in scorer_arrays.items()}
    for k, (bx, by) in enumerate(zip(cal.thresholds_x_, cal.thresholds_y_, strict=True)):
        arrays[f"{_CAL_X}{k}"] = bx
        arrays[f"{_CAL_Y}{k}"] = by
    arrays_path = out / ARRAYS_FILE
    np.savez_compressed(arrays_path, allow_pickle=False, **arrays)
    # Held-out probabilities belong to the model that produced them: a retrained model in the
    # same directory must not inherit its predecessor's (tenant alphas are tuned on them).
    (out / VALIDATION_FILE).unlink(missing_ok=True)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "tiers": list(model.tiers),
        "label": model.label,
        "gram_spec": asdict(model.spec),
        "scorer": {
            "name": model.scorer.name,
            "params": model.scorer.get_params(deep=False),
            "state": meta,
        },
        "calibration": {
            "include_top": cal.include_top,
            "centered": cal.centered,
            "n_calibrated": len(cal.thresholds_x_),
            "n_labelled": cal.n_labelled_,
        },
        "arrays_sha256": _sha256(arrays_path),
        "metadata": model.metadata,
    }
    (out / MODEL_FILE).write_text(strict_dumps(document, sort_keys=True) + "\n")
    return out


def load_model(path: str | Path) -> RouterModel:
    """Read a directory written by `save_model`; raises `ModelFormatError` on any problem."""
    root = Path(path)
    model_path = root / MODEL_FILE
    arrays_path = root / ARRAYS_FILE
    if not model_path.is_file() or not arrays_path.is_file():
        raise ModelFormatError(
            f"{root}: not a router model directory (needs {MODEL_FILE} and {ARRAYS_FILE})"
        )
    try:
        document = json.loads(model_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{model_path}: unreadable ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelFormatError(f"{model_path}: not a {FORMAT} model")
    if document.get("version") != VERSION:
        raise ModelFormatError(
            f"{model_path}: format version {document.get('version')!r}, this code reads {VERSION}"
        )
    if document.get("arrays_sha256") != _sha256(arrays_path):
        raise ModelFormatError(f"{arrays_path}: checksum does not match {MODEL_FILE}")
    try:
        with np.load(arrays_path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        return _build(document, arrays)
    except ModelFormatError:
        raise
    except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ModelFormatError(f"{root}: invalid model ({type(exc).__name__}: {exc})") from None


def save_validation(
    path: str | Path, proba: NDArray[np.float64], correct: NDArray[np.float64]
) -> Path:
    """Store held-out (n, K) probabilities and per-tier scores next to the model saved in
    `path`, stamped with that model's checksum."""
    p = np.asarray(proba, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    if p.ndim != 2 or p.shape != c.shape:
        raise ValueError("proba and correct must both have shape (n, K)")
    model_sha, n_tiers = _model_stamp(Path(path))
    if p.shape[1] != n_tiers:
        raise ValueError(f"the validation set has {p.shape[1]} tiers, the model {n_tiers}")
    out = Path(path) / VALIDATION_FILE
    np.savez_compressed(out, allow_pickle=False, proba=p, correct=c, model_sha256=model_sha)
    return out


def load_validation(
    path: str | Path,
) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """(proba, correct) from a model directory's validation.npz, or None when it has none."""
    source = Path(path) / VALIDATION_FILE
    if not source.is_file():
        return None
    try:
        with np.load(source, allow_pickle=False) as npz:
            proba = np.asarray(npz["proba"], dtype=np.float64)
            correct = np.asarray(npz["correct"], dtype=np.float64)
            stamp = str(npz["model_sha256"]) if "model_sha256" in npz.files else None
        model_sha, n_tiers = _model_stamp(Path(path))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ModelFormatError(f"{source}: invalid validation set ({exc})") from None
    if proba.ndim != 2 or proba.shape != correct.shape:
        raise ModelFormatError(f"{source}: proba and correct differ in shape")
    # Unstamped: written before stamps existed (save_model has since removed stale files
    # itself); it is taken when its ladder fits.
    if stamp is not None and stamp != model_sha:
        raise ModelFormatError(
            f"{source}: belongs to another model than {MODEL_FILE} beside it; "
            "retrain with --cv to write a new one"
        )
    if proba.shape[1] != n_tiers:
        raise ModelFormatError(f"{source}: {proba.shape[1]} tiers, the model has {n_tiers}")
    _check_validation_values(source, proba, correct)
    return proba, correct


def _check_validation_values(
    source: Path, proba: NDArray[np.float64], correct: NDArray[np.float64]
) -> None:
    """Refuses values a tenant's thresholds would be tuned on silently wrong: probabilities
    outside [0, 1] or not finite, scores outside [0, 1] (NaN is a missing score, as in the
    label files)."""
    if not np.all((proba >= 0.0) & (proba <= 1.0)):  # also rejects NaN
        raise ModelFormatError(f"{source}: proba holds values that are not numbers in [0, 1]")
    known = correct[~np.isnan(correct)]
    if not np.all((known >= 0.0) & (known <= 1.0)):
        raise ModelFormatError(f"{source}: correct holds scores outside [0, 1]")


def model_checksum(path: str | Path) -> str:
    """The SHA-256 of the weights the model saved in `path` records (what `load_model`
    verifies): two directories with the same checksum hold the same scorer."""
    return _model_stamp(Path(path))[0]


def _model_stamp(root: Path) -> tuple[str, int]:
    """(arrays checksum, number of tiers) of the model saved in `root`."""
    try:
        document = json.loads((root / MODEL_FILE).read_text())
        return str(document["arrays_sha256"]), len(document["tiers"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"no readable model in {root} ({exc})") from None


def _build(document: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> RouterModel:
    scorer_doc = document["scorer"]
    name = str(scorer_doc["name"])
    scorer_arrays = {k[len(_SCORER) :]: v for k, v in arrays.items() if k.startswith(_SCORER)}
    spec = GramSpec(**document["gram_spec"])
    # The hot path is rebuilt from the state alone; the scikit-learn scorer (batch scoring,
    # saving) only when something asks for it, so a serving gateway never imports sklearn.
    lean = lean_from_state(name, spec, scorer_doc["state"], scorer_arrays)

    def load_scorer() -> Scorer:
        from router_models.scorers import scorer_from_state

        try:
            return scorer_from_state(name, scorer_doc["params"], scorer_doc["state"], scorer_arrays)
        except (KeyError, TypeError, ValueError) as exc:
            # Loaded on first batch use, after load_model returned: still the model's fault.
            raise ModelFormatError(f"invalid {name} scorer ({type(exc).__name__}: {exc})") from None

    cal_doc = document["calibration"]
    n_cal = int(cal_doc["n_calibrated"])
    calibration = IsotonicMaps.from_thresholds(
        [np.asarray(arrays[f"{_CAL_X}{k}"], dtype=np.float64) for k in range(n_cal)],
        [np.asarray(arrays[f"{_CAL_Y}{k}"], dtype=np.float64) for k in range(n_cal)],
        include_top=bool(cal_doc["include_top"]),
        centered=bool(cal_doc.get("centered", False)),
        n_labelled=[int(n) for n in cal_doc.get("n_labelled", [])],
    )
    return RouterModel(
        tiers=document["tiers"],  # RouterModel checks it is a list of names
        scorer=DeferredScorer(name, load_scorer),
        calibration=calibration,
        spec=spec,
        label=document["label"],
        metadata=document.get("metadata") or {},
        _lean=lean,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
