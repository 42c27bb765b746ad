"""The supervisor's copy of the last valid configuration, and a worker starting from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.app import (
    CONFIG_ENV,
    LAST_VALID_CONFIG_ENV,
    WORKERS_ENV,
    check_settings,
    create_app_from_env,
)
from gateway.config import ConfigError, load_settings, parse_settings
from gateway.last_valid import LastValidConfig
from gateway.launcher import edit_check
from gateway.routing.factory import build_policy
from tests.helpers import MODEL, write_settings


def _settings(port: int, **extra: object):  # type: ignore[no-untyped-def]
    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": "a", "precision": "nvfp4", "endpoints": [f"http://127.0.0.1:{port}/v1"]},
                {"name": "b", "precision": "bf16", "endpoints": [f"http://127.0.0.1:{port}/v1"]},
            ],
            "tenants": [{"name": "t", "api_keys": ["sk-t"]}],
            **extra,
        }
    )


REDIS_URL = "redis://127.0.0.1:1"


def _write_with_redis(path: Path) -> None:
    """The 9001 settings asking for Redis-shared limits (write_settings masks the URL, a
    secret, which would make the file invalid for another reason)."""
    import yaml

    data = _settings(9001).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = ["sk-t"]
    data["shared_limits"]["redis_url"] = REDIS_URL
    path.write_text(yaml.safe_dump(data))


def _validate(path: Path) -> None:
    check_settings(load_settings(path), build_policy)


def test_the_copy_follows_valid_edits_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    kept = LastValidConfig(source, tmp_path / "kept.yaml", _validate)
    assert kept.copy.read_text() == source.read_text()
    good = source.read_text()
    source.write_text(good + "\ntiers: 5\n")
    with caplog.at_level("ERROR"):
        assert not kept.refresh() and kept.copy.read_text() == good  # invalid: kept as it was
    # The reason names the operator's file, not the scratch copy it was validated as.
    assert f"{source}: not valid YAML" in caplog.text
    assert ".partial" not in caplog.text
    write_settings(source, _settings(9002))
    assert kept.refresh() and "9002" in kept.copy.read_text()
    assert not kept.refresh()  # unchanged since the last look: not re-validated


def test_the_copy_refuses_an_edit_the_running_workers_refuse_to_reload(tmp_path: Path) -> None:
    """A shared_limits change is valid on its own but no running worker can reload it: a
    replacement worker started from it would serve other limits than its siblings."""
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    copy = tmp_path / "last-valid.yaml"
    kept = LastValidConfig(source, copy, edit_check(copy))
    original = copy.read_text()
    edited = _settings(9001, shared_limits={"redis_url": REDIS_URL})
    check_settings(edited, build_policy)  # valid for a fresh start
    _write_with_redis(source)
    assert not kept.refresh() and copy.read_text() == original
    write_settings(source, _settings(9002))  # a change a reload accepts still goes through
    assert kept.refresh() and "9002" in copy.read_text()


def test_a_replacement_worker_runs_what_its_siblings_run_after_a_restart_only_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file now asks for Redis-shared limits, which the running workers refused to
    reload: a worker started now takes the kept copy, not the file, so all serve alike."""
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    copy = tmp_path / "last-valid.yaml"
    LastValidConfig(source, copy, edit_check(copy))
    _write_with_redis(source)
    assert load_settings(source).shared_limits.redis_url is not None  # valid on its own
    monkeypatch.setenv(CONFIG_ENV, str(source))
    monkeypatch.setenv(LAST_VALID_CONFIG_ENV, str(copy))
    app = create_app_from_env()
    assert app.runtime.settings.shared_limits.redis_url is None
    assert app.config_path == source


def test_a_worker_starts_from_the_kept_copy_while_the_file_is_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    kept = LastValidConfig(source, tmp_path / "kept.yaml", _validate)
    source.write_text("tiers: 5\n")
    monkeypatch.setenv(CONFIG_ENV, str(source))
    monkeypatch.delenv(LAST_VALID_CONFIG_ENV, raising=False)
    with pytest.raises(ConfigError):
        create_app_from_env()  # nothing kept: the error stands
    monkeypatch.setenv(LAST_VALID_CONFIG_ENV, str(kept.copy))
    app = create_app_from_env()
    assert [tier.name for tier in app.runtime.settings.tiers] == ["a", "b"]
    assert app.config_path == source  # and it keeps watching the real file


def test_a_worker_runs_on_its_socket_and_worker_count_at_start_and_after_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --workers 2 --host 0.0.0.0 --port 8123` with a file that says otherwise: each
    worker reports what runs (/admin/config), and a reload is no server change: it warned,
    on every reload, that host, port and workers apply only at a restart."""
    source = write_settings(tmp_path / "c.yaml", _settings(9001))  # 127.0.0.1:8000, 1 worker
    monkeypatch.setenv(CONFIG_ENV, str(source))
    monkeypatch.delenv(LAST_VALID_CONFIG_ENV, raising=False)
    monkeypatch.setenv(WORKERS_ENV, "2")
    app = create_app_from_env("0.0.0.0", 8123)
    running = ("0.0.0.0", 8123, 2)
    server = app.runtime.settings.server
    assert (server.host, server.port, server.workers) == running
    with caplog.at_level("WARNING"):
        app.reload()
    assert "apply at start" not in caplog.text
    server = app.runtime.settings.server
    assert (server.host, server.port, server.workers) == running


def test_check_settings_sees_an_unwritable_label_log(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    label_log = str(tmp_path / "a-file" / "labels.jsonl")  # its directory cannot exist
    settings = _settings(9001, shadow={"rate": 0.1, "label_log": label_log})
    with pytest.raises(ConfigError, match=r"shadow\.label_log: .*a-file is not a directory"):
        check_settings(settings, build_policy)


def test_a_file_that_parses_but_cannot_serve_also_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tenants sharing a key pass the schema and fail when the app is built."""
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    kept = LastValidConfig(source, tmp_path / "kept.yaml", _validate)
    shared = _settings(9001).model_dump(mode="json")
    shared["tenants"] = [
        {"name": "t1", "api_keys": ["sk-same"]},
        {"name": "t2", "api_keys": ["sk-same"]},
    ]
    import yaml

    source.write_text(yaml.safe_dump(shared))
    monkeypatch.setenv(CONFIG_ENV, str(source))
    monkeypatch.setenv(LAST_VALID_CONFIG_ENV, str(kept.copy))
    app = create_app_from_env()
    assert [tenant.name for tenant in app.runtime.settings.tenants] == ["t"]


def test_the_copy_is_the_file_that_was_validated(tmp_path: Path) -> None:
    """A file read half-written, whose write ends before it is validated: the copy held the
    half read first while the complete file passed, so a replacement worker would start
    from a file no one validated."""
    source = write_settings(tmp_path / "c.yaml", _settings(9001))
    complete = source.read_text()
    pending_write: list[str] = []

    def validate(path: Path) -> None:
        if pending_write:  # the writer finishes after the refresh read the file
            source.write_text(pending_write.pop())
        _validate(path)

    kept = LastValidConfig(source, tmp_path / "kept.yaml", validate)
    source.write_text(complete[: len(complete) // 2])
    pending_write.append(complete)
    kept.refresh()
    assert kept.copy.read_text() == complete  # never the half


def test_a_file_replaced_by_one_of_the_same_mtime_and_size_is_seen(tmp_path: Path) -> None:
    # `cp -p new.yaml tiergate.yaml.tmp && mv ...`: the workers reloaded it (their watch
    # compares the inode too), while the copy a replacement worker starts from stayed old.
    source = tmp_path / "c.yaml"
    source.write_text("a: 1\n")
    kept = LastValidConfig(source, tmp_path / "copy.yaml", lambda _path: None)
    replacement = tmp_path / "new.yaml"
    replacement.write_text("a: 2\n")
    status = source.stat()
    os.utime(replacement, ns=(status.st_atime_ns, status.st_mtime_ns))
    os.replace(replacement, source)
    assert kept.refresh()
    assert kept.copy.read_text() == "a: 2\n"


@pytest.mark.parametrize(
    ("admin", "environ"),
    [({"token": "   "}, {}), ({"token_env": "ADMIN_TOKEN"}, {"ADMIN_TOKEN": " \n"})],
)
def test_check_settings_refuses_an_admin_token_of_whitespace(
    admin: dict[str, str], environ: dict[str, str]
) -> None:
    # The gateway refuses it at start and on reload: `check` called such a file valid,
    # `serve --workers` started workers that each failed, and the supervisor kept the file
    # as the last valid copy a replacement worker starts from.
    with pytest.raises(ConfigError, match="only whitespace"):
        check_settings(_settings(9, admin=admin), build_policy, environ)
