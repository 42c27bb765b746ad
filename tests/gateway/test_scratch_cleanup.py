"""`serve --workers` scratch folders: a supervisor that is gone (SIGKILLed before its own
clean-up) leaves folders whose lock is free, and the next one removes them; a live one's,
and folders that are not ours, stay. Nothing depends on process ids (in a container every
supervisor may be pid 1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.scratch import LOCK_NAME, remove_orphaned_scratch, scratch_dir

# A supervisor stand-in: takes a scratch folder, says where, and is then SIGKILLed.
HOLDER = """
import sys, time
from pathlib import Path
from gateway.scratch import scratch_dir
with scratch_dir(sys.argv[1], Path(sys.argv[2])) as folder:
    print(folder, flush=True)
    time.sleep(60)
"""


def test_only_folders_of_dead_supervisors_are_removed(tmp_path: Path) -> None:
    killed = []
    for kind in ("config", "metrics"):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, kind, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        killed.append(Path(holder.stdout.readline().strip()))
        holder.kill()
        holder.wait(timeout=10)
    foreign = [tmp_path / "tiergate-config-nolock", tmp_path / "tiergate-linked"]
    foreign[0].mkdir()
    foreign[1].mkdir()
    (foreign[1] / LOCK_NAME).symlink_to(tmp_path / "elsewhere")  # never followed
    with scratch_dir("config", tmp_path) as live:
        assert all(folder.is_dir() for folder in killed)  # the kill skipped their clean-up
        assert sorted(remove_orphaned_scratch(tmp_path)) == sorted(killed)
        assert live.is_dir() and all(folder.is_dir() for folder in foreign)
    assert not live.exists()  # removed by its own clean-up


def test_a_folder_is_locked_before_its_lock_file_is_visible(tmp_path: Path) -> None:
    with scratch_dir("metrics", tmp_path) as folder:
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
        assert remove_orphaned_scratch(tmp_path) == []
