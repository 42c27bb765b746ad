"""`serve --workers` scratch folders of a supervisor that is gone (SIGKILLed before its own
cleanup) are removed by the next supervisor; a live one's, and anything else, are kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.launcher import remove_orphaned_scratch


def test_only_folders_of_dead_supervisors_are_removed(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dead = [tmp_path / f"tiergate-config-{gone}-x1", tmp_path / f"tiergate-metrics-{gone}-x2"]
    live = [tmp_path / f"tiergate-config-{os.getpid()}-y", tmp_path / "tiergate-metrics-1-z"]
    other = [tmp_path / "tiergate-config-notapid-w", tmp_path / f"tiergate-other-{gone}-v"]
    for folder in (*dead, *live, *other):
        folder.mkdir()
        (folder / "last-valid.yaml").write_text("model: m\n")
    assert sorted(remove_orphaned_scratch(tmp_path)) == sorted(dead)
    assert not any(folder.exists() for folder in dead)
    assert all(folder.exists() for folder in (*live, *other))
