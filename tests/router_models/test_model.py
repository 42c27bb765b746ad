"""RouterModel: the gateway's interface, save/load round trip, safe format, default model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router_models.calibration import TierCalibration
from router_models.data import LabelSet
from router_models.errors import ModelFormatError
from router_models.model import RouterModel, default_model_path
from router_models.model_io import ARRAYS_FILE, MODEL_FILE

ODD_REQUESTS = [
    {"messages": []},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    {"messages": [{"role": "assistant", "tool_calls": [{"id": "a"}]}, {"role": "tool"}]},
    {"prompt": [1, 2, 3]},
    {"prompt": ["a", "b"]},
    {},
]


def test_interface(linear_model: RouterModel, three_tier: LabelSet) -> None:
    assert linear_model.tiers == ("nvfp4", "w4a16", "bf16")
    p = linear_model.predict_proba_one(three_tier.requests[0])
    assert len(p) == 3 and p[-1] == 1.0
    assert all(a <= b for a, b in pairwise(p))
    assert isinstance(linear_model.score_one(three_tier.requests[0]), float)
    assert linear_model.predict_proba(three_tier.requests[:5]).shape == (5, 3)


@pytest.mark.parametrize("request_body", ODD_REQUESTS)
def test_odd_requests_route(linear_model: RouterModel, request_body: dict[str, object]) -> None:
    p = linear_model.predict_proba_one(request_body)
    assert all(0.0 <= x <= 1.0 and not math.isnan(x) for x in p)


def test_save_load_round_trip(
    tmp_path: Path, linear_model: RouterModel, gbdt_model: RouterModel, three_tier: LabelSet
) -> None:
    for model in (linear_model, gbdt_model):
        out = model.save(tmp_path / model.scorer.name)
        again = RouterModel.load(out)
        assert again.tiers == model.tiers and again.label == model.label
        np.testing.assert_array_equal(
            again.predict_proba(three_tier.requests), model.predict_proba(three_tier.requests)
        )
        r = three_tier.requests[3]
        assert again.predict_proba_one(r) == model.predict_proba_one(r)
        # The loaded model's one-request path is rebuilt from the saved state, not from the
        # scikit-learn scorer: it must still agree with the batch path on every request.
        batch = again.predict_proba(three_tier.requests[:50])
        one = [again.predict_proba_one(body) for body in three_tier.requests[:50]]
        np.testing.assert_allclose(one, batch, rtol=0, atol=1e-12)


def test_serving_a_loaded_model_imports_neither_sklearn_nor_scipy() -> None:
    """The gateway only serves: loading and routing must not pay for the training stack."""
    code = (
        "import sys\n"
        "import gateway.app\n"
        "from router_models.model import RouterModel, default_model_path\n"
        "m = RouterModel.load(default_model_path())\n"
        "m.predict_proba_one({'messages': [{'role': 'user', 'content': 'hi'}]})\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'sklearn', 'scipy'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_with_calibration_keeps_the_scorer(linear_model: RouterModel, three_tier: LabelSet) -> None:
    score = linear_model.score(three_tier.requests)
    flat = TierCalibration().fit(score, np.full((len(score), 2), 0.5))
    other = linear_model.with_calibration(flat)
    assert other.scorer is linear_model.scorer
    assert other.predict_proba_one(three_tier.requests[0])[:2] == (0.5, 0.5)


def test_tampered_or_incomplete_directories_are_refused(
    tmp_path: Path, linear_model: RouterModel
) -> None:
    out = linear_model.save(tmp_path / "m")
    with pytest.raises(ModelFormatError, match="not a router model"):
        RouterModel.load(tmp_path)
    arrays = out / ARRAYS_FILE
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(ModelFormatError, match="checksum"):
        RouterModel.load(out)
    doc = json.loads((out / MODEL_FILE).read_text())
    doc["version"] = 99
    (out / MODEL_FILE).write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match="version"):
        RouterModel.load(out)


def test_object_arrays_are_never_unpickled(tmp_path: Path, linear_model: RouterModel) -> None:
    out = linear_model.save(tmp_path / "m")
    arrays = out / ARRAYS_FILE
    np.savez(arrays, scorer__gram_coef=np.array([object()], dtype=object), allow_pickle=True)
    doc = json.loads((out / MODEL_FILE).read_text())
    from router_models.model_io import _sha256

    doc["arrays_sha256"] = _sha256(arrays)
    (out / MODEL_FILE).write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError):
        RouterModel.load(out)


def test_default_model_ships_and_routes() -> None:
    path = default_model_path()
    size = sum(f.stat().st_size for f in path.iterdir())
    assert size < 5 * 1024 * 1024
    assert (path / "MODEL_CARD.md").is_file()
    model = RouterModel.load(path)
    assert len(model.tiers) >= 2
    for body in ODD_REQUESTS:
        p = model.predict_proba_one(body)
        assert len(p) == len(model.tiers) and p[-1] == 1.0


def _tamper(out: Path, edit_doc: Any = None, edit_arrays: Any = None) -> None:
    """Edits a saved model and re-seals its checksum, as a careless hand (or a tool) might."""
    from router_models.model_io import _sha256

    doc = json.loads((out / MODEL_FILE).read_text())
    if edit_arrays is not None:
        with np.load(out / ARRAYS_FILE) as npz:
            arrays = {k: npz[k] for k in npz.files}
        edit_arrays(arrays)
        np.savez_compressed(out / ARRAYS_FILE, **arrays)
        doc["arrays_sha256"] = _sha256(out / ARRAYS_FILE)
    if edit_doc is not None:
        edit_doc(doc)
    (out / MODEL_FILE).write_text(json.dumps(doc))


def test_inconsistent_model_files_are_refused_at_load(
    tmp_path: Path, linear_model: RouterModel, gbdt_model: RouterModel
) -> None:
    """Each of these loaded, then failed per request (IndexError), looped forever (a tree
    node that is its own child) or scored silently wrong (a gram spec of other size); a null
    gram weight failed per request (TypeError)."""

    def bits(doc: dict[str, Any]) -> None:
        doc["gram_spec"]["bits"] = 17

    def short_coef(arrays: dict[str, Any]) -> None:
        arrays["scorer__gram_coef"] = arrays["scorer__gram_coef"][:-5]

    def two_d_coef(arrays: dict[str, Any]) -> None:  # as many weights, wrong shape
        arrays["scorer__gram_coef"] = arrays["scorer__gram_coef"].reshape(1, -1)

    def self_loop(arrays: dict[str, Any]) -> None:
        root = int(arrays["scorer__tree_roots"][0])
        arrays["scorer__tree_left"][root] = root

    def far_feature(arrays: dict[str, Any]) -> None:
        inner = np.flatnonzero(~arrays["scorer__tree_is_leaf"])
        arrays["scorer__tree_feature"][inner[0]] = 999

    def null_weight(doc: dict[str, Any]) -> None:
        doc["gram_spec"]["word_weight"] = None

    def ladder_as_a_string(doc: dict[str, Any]) -> None:
        doc["tiers"] = "abc"

    def nan_breakpoint(arrays: dict[str, Any]) -> None:
        arrays["calibration__y_0"] = arrays["calibration__y_0"].copy()
        arrays["calibration__y_0"][0] = np.nan

    cases = [
        (linear_model, bits, None, "buckets"),
        (linear_model, null_weight, None, "word_weight must be a finite number"),
        (linear_model, ladder_as_a_string, None, "list of tier names"),
        (linear_model, None, nan_breakpoint, "finite"),
        (linear_model, None, short_coef, "buckets"),
        (linear_model, None, two_d_coef, r"gram weights must be one-dimensional, got shape \(1, "),
        (gbdt_model, None, self_loop, "children"),
        (gbdt_model, None, far_feature, "features out of range"),
    ]
    for i, (model, edit_doc, edit_arrays, says) in enumerate(cases):
        out = model.save(tmp_path / f"m{i}")
        _tamper(out, edit_doc, edit_arrays)
        with pytest.raises(ModelFormatError, match=says):
            RouterModel.load(out)


def test_a_bad_scorer_parameter_is_a_format_error_when_the_scorer_loads(
    tmp_path: Path, linear_model: RouterModel, three_tier: LabelSet
) -> None:
    out = linear_model.save(tmp_path / "m")
    _tamper(out, edit_doc=lambda doc: doc["scorer"]["params"].update(bogus=1))
    model = RouterModel.load(out)  # the hot path does not need the scikit-learn scorer
    with pytest.raises(ModelFormatError, match="invalid linear scorer"):
        model.predict_proba(list(three_tier.requests[:3]))


def test_an_absolute_label_model_routes_on_the_loss_against_the_top_tier(
    three_tier: LabelSet,
) -> None:
    from router_models.labels import routing_proba
    from router_models.training import TrainConfig, fit_router

    model = fit_router(three_tier, TrainConfig(scorer="linear", label="absolute"))
    scores = model.score(three_tier.requests[:50])
    calibrated = model.calibration.predict_proba(scores)
    routed = model.routing_proba(scores)
    assert np.allclose(routed, routing_proba(calibrated, "absolute"))
    assert routed[:, -1].tolist() == [1.0] * 50  # unlike P(top tier correct)
    for score, row in zip(scores[:10], routed[:10], strict=True):
        assert model.routing_proba_one(float(score)) == pytest.approx(tuple(row))
    # Shadow labels are relative: calibrators refitted on them make a relative-label model.
    flat = TierCalibration().fit(scores, np.full((50, 2), 0.5))
    assert model.with_calibration(flat).label == "relative"


def test_validation_values_outside_their_domain_are_refused(
    tmp_path: Path, linear_model: RouterModel
) -> None:
    """validation.npz with NaN or out-of-range probabilities, or scores outside [0, 1], loaded
    silently and tenant thresholds were tuned on them; a missing score (NaN) stays allowed."""
    from router_models.model_io import VALIDATION_FILE, load_validation, model_checksum

    out = linear_model.save(tmp_path / "m")
    good_proba = np.tile([0.5, 0.7, 1.0], (3, 1))
    good_correct = np.array([[1.0, np.nan, 1.0], [0.0, 0.5, 1.0], [1.0, 1.0, 0.0]])
    cases = [
        (np.full((3, 3), np.nan), np.ones((3, 3)), "proba"),
        (good_proba + 0.6, np.ones((3, 3)), "proba"),
        (good_proba - 0.6, np.ones((3, 3)), "proba"),
        (good_proba, np.full((3, 3), -2.0), "correct"),
        (good_proba, np.full((3, 3), np.inf), "correct"),
    ]
    stamp: dict[str, Any] = {"model_sha256": model_checksum(out)}
    for proba, correct, says in cases:
        for extra in ({}, stamp):  # unstamped (older) and stamped files alike
            np.savez(out / VALIDATION_FILE, proba=proba, correct=correct, **extra)
            with pytest.raises(ModelFormatError, match=f"{VALIDATION_FILE}: {says}"):
                load_validation(out)
    np.savez(out / VALIDATION_FILE, proba=good_proba, correct=good_correct, **stamp)
    loaded = load_validation(out)
    assert loaded is not None and np.isnan(loaded[1][0, 1])
