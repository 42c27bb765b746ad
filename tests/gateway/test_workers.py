"""`tiergate serve --workers 2`: one port, a socket per worker, metrics merged across them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.config import AdminSettings
from gateway.workers import WorkerSupervisor
from tests.helpers import API_KEY, MODEL, GatewayProcess, Ladder, send, write_settings

REQUESTS = 400
SERVE = [sys.executable, "-m", "gateway.cli.main", "serve"]


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def listening_sockets(port: int) -> int:
    """LISTEN sockets on `port` (Linux /proc): one per worker once it has bound its own."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    count += 1
    return count


def worker_pids(metrics_dir: Path) -> set[int]:
    """Workers that have started, by the metric files each writes (build_info: one per pid)."""
    return {int(f.stem.split("_")[-1]) for f in metrics_dir.glob("gauge_max_*.db")}


def two_workers_then_kill_one(metrics_dir: Path, before_kill: Callable[[], None]) -> set[int]:
    """Waits for both workers, runs `before_kill`, SIGKILLs one, waits for its replacement;
    returns the first two pids."""
    deadline = time.monotonic() + 20
    while len(worker_pids(metrics_dir)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    before = worker_pids(metrics_dir)
    assert len(before) == 2
    before_kill()
    os.kill(min(before), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while len(worker_pids(metrics_dir) - before) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(worker_pids(metrics_dir) - before) == 1  # a replacement started
    return before


def requests_total(text: str) -> float:
    return sum(
        float(match.group(1))
        for match in re.finditer(
            r'^tiergate_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.M
        )
    )


@pytest.mark.slow
def test_two_workers_share_the_port_and_the_counters(ladder: Ladder, tmp_path: Path) -> None:
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    metrics_dir = tmp_path / "metrics"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    process = GatewayProcess(path, env=env)
    process.argv_extra = ["--workers", "2"]
    with process as gw:
        # /health answers as soon as the first worker listens; wait for the second.
        deadline = time.monotonic() + 60
        while listening_sockets(gw.port) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listening_sockets(gw.port) == 2
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ).encode()

        def call(_: int) -> int:
            request = urllib.request.Request(
                f"{gw.url}/v1/chat/completions", data=body, method="POST"
            )
            request.add_header("authorization", f"Bearer {API_KEY}")
            request.add_header("content-type", "application/json")
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)

        # Fresh connections: the kernel hashes each one to one worker's socket.
        with ThreadPoolExecutor(max_workers=16) as pool:
            statuses = list(pool.map(call, range(REQUESTS)))
        assert statuses == [200] * REQUESTS
        # Workers flush their batched counters into the shared files every second.
        deadline = time.monotonic() + 10
        pids = set()
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = {f.name.split("_")[-1] for f in metrics_dir.glob("counter_*.db")}
        assert len(pids) >= 2, os.listdir(metrics_dir)  # both workers counted requests
        # Whichever worker answers the scrape, it reports the total over all workers.
        deadline = time.monotonic() + 5
        totals = [requests_total(scrape(gw.url)) for _ in range(6)]
        while set(totals) != {float(REQUESTS)} and time.monotonic() < deadline:
            time.sleep(0.1)
            totals = [requests_total(scrape(gw.url)) for _ in range(6)]
        assert set(totals) == {float(REQUESTS)}


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_port_keeps_answering(
    ladder: Ladder, tmp_path: Path
) -> None:
    # The observer scrapes every second, so each worker soon writes its live-mode gauges.
    observer = {"scrape_interval_s": 1, "plan_interval_s": 1}
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings(observer=observer))
    metrics_dir = tmp_path / "metrics"
    process = GatewayProcess(path, env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    process.argv_extra = ["--workers", "2"]

    def live_gauge_files() -> set[str]:
        return {f.name for f in metrics_dir.glob("gauge_live*_*.db")}

    def both_write_live_gauges() -> None:
        deadline = time.monotonic() + 20
        while len(live_gauge_files()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(live_gauge_files()) >= 2

    with process as gw:
        before = two_workers_then_kill_one(metrics_dir, both_write_live_gauges)
        dead = min(before)
        with pytest.raises(ProcessLookupError):  # and the dead one was reaped
            os.kill(dead, 0)
        # Its regime gauges no longer count in the merged exposition (marked dead before the
        # replacement started).
        assert not {name for name in live_gauge_files() if name.endswith(f"_{dead}.db")}
        for _ in range(20):
            with urllib.request.urlopen(f"{gw.url}/ready", timeout=10) as response:
                assert response.status == 200


@pytest.mark.slow
def test_a_worker_replaced_while_the_file_is_invalid_starts_on_the_last_valid_one(
    ladder: Ladder, tmp_path: Path
) -> None:
    """The running workers refuse a bad edit and keep serving; a worker that dies then is
    replaced from the last valid configuration (it read the bad file, died at start five
    times, and the supervisor stopped the healthy worker with it)."""
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    metrics_dir = tmp_path / "metrics"
    log_path = tmp_path / "serve.log"
    process = GatewayProcess(
        path, env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}, log_path=log_path
    )
    process.argv_extra = ["--workers", "2"]

    def break_the_file() -> None:
        path.write_text(path.read_text() + "\ntiers: 5\n")  # invalid from now on
        time.sleep(2.5)  # the workers' file watch refuses it

    with process as gw:
        two_workers_then_kill_one(metrics_dir, break_the_file)
        time.sleep(3)  # longer than a failed start's restart back-off
        assert gw.process is not None and gw.process.poll() is None  # the supervisor serves
        for _ in range(20):
            with urllib.request.urlopen(f"{gw.url}/ready", timeout=10) as response:
                assert response.status == 200
        assert "starting on the last valid configuration" in log_path.read_text()


@pytest.mark.slow
def test_workers_survive_an_early_sighup_and_end_with_their_supervisor(
    ladder: Ladder, tmp_path: Path
) -> None:
    """A SIGHUP forwarded before a worker installed its reload handler ended the worker (the
    default action) and counted as a failed start; a SIGKILLed supervisor left its workers
    serving as orphans that hold the port."""
    from gateway.launcher import stop_processes, wait_healthy
    from tests.helpers import free_port

    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    metrics_dir = tmp_path / "metrics"
    port = free_port()
    supervisor = subprocess.Popen(
        [*SERVE, "--config", str(path), "--port", str(port), "--workers", "2"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        start_new_session=True,
    )
    try:
        children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children")
        deadline = time.monotonic() + 30
        while len(children.read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listening_sockets(port) == 0  # the workers are starting, not serving yet
        supervisor.send_signal(signal.SIGHUP)
        wait_healthy(f"http://127.0.0.1:{port}/health", 60, supervisor)
        deadline = time.monotonic() + 30
        while listening_sockets(port) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listening_sockets(port) == 2
        workers = worker_pids(metrics_dir)
        assert len(workers) == 2  # the first two, none replaced
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 40  # a graceful drain, then exit
        while listening_sockets(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert listening_sockets(port) == 0
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(running(pid) for pid in workers)
    finally:
        stop_processes([supervisor])
        for pid in worker_pids(metrics_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status waits for whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _exit_at_once(host: str, port: int) -> None:
    """A worker that fails at start-up (spawned: it must be importable by name)."""
    raise SystemExit(3)


@pytest.mark.slow
def test_workers_that_keep_failing_at_start_stop_the_supervisor() -> None:
    supervisor = WorkerSupervisor("127.0.0.1", 0, 2, target=_exit_at_once)
    with pytest.raises(RuntimeError, match=r"5 workers in a row exited .* exit code 3"):
        supervisor.run()


def _wait_for_stop(host: str, port: int) -> None:
    """A worker that serves nothing until the supervisor's SIGTERM ends it."""
    time.sleep(120)


@pytest.mark.slow
def test_a_reload_forwarded_while_a_worker_starts_does_not_end_it() -> None:
    """The SIGHUP reached a worker still starting its interpreter, before it could ignore
    the signal, and ended it (the default action): a reload as a worker started cost a
    restart, and a few in a row stopped the supervisor."""
    supervisor = WorkerSupervisor("127.0.0.1", 0, 1, target=_wait_for_stop)
    pids: list[int | None] = []

    def reload_as_the_worker_starts() -> None:
        deadline = time.monotonic() + 30
        while not supervisor._workers and time.monotonic() < deadline:
            time.sleep(0.001)
        pids.append(supervisor._workers[0].pid)
        os.kill(os.getpid(), signal.SIGHUP)  # forwarded while the worker imports its modules
        time.sleep(3)  # past the restart back-off: a worker it ended is replaced by now
        pids.append(supervisor._workers[0].pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=reload_as_the_worker_starts, daemon=True)
    thread.start()
    supervisor.run()
    thread.join()
    assert pids[0] is not None and pids == [pids[0], pids[0]]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_config_pydantic_accepts_but_cannot_serve_fails_in_one_line(
    ladder: Ladder, tmp_path: Path, workers: str
) -> None:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [
        {"name": "a", "api_keys": ["sk-same"]},
        {"name": "b", "api_keys": ["sk-same"]},
    ]
    path = tmp_path / "tiergate.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    done = subprocess.run(
        [*SERVE, "--config", str(path), "--workers", workers, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == "tiergate: an API key is configured for both 'a' and 'b'\n"


def write_unseen_by_the_file_watch(path: Path, data: dict[str, object]) -> None:
    """Rewrites `path` in place keeping its mtime, size and inode (the watch's stamp): as a
    change beside the config file (a retrained router model) would, only an explicit reload
    applies it. The new text, shorter, is padded with a comment to the old size."""
    import yaml

    before = path.stat()
    text = yaml.safe_dump(data)
    padding = before.st_size - len(text.encode()) - 2
    assert padding >= 0, "the new configuration must be shorter than the old one"
    path.write_text(text + "#" + "x" * padding + "\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)


def every_worker_accepts(url: str, key: str) -> bool:
    """20 fresh connections in a row (spread over the workers) accept `key`."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    deadline = time.monotonic() + 15
    ok = 0
    while ok < 20 and time.monotonic() < deadline:
        reply = send("POST", f"{url}/v1/chat/completions", chat, key=key)
        ok = ok + 1 if reply.status == 200 else 0
        time.sleep(0.05)
    return ok == 20


@pytest.mark.slow
def test_sighup_reloads_every_worker_and_a_second_supervisor_is_refused(
    ladder: Ladder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}  # the supervisor's own metrics folder goes here
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    process = GatewayProcess(path, env=env)
    process.argv_extra = ["--workers", "2"]
    with process as gw:
        deadline = time.monotonic() + 60
        while listening_sockets(gw.port) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Another supervisor on the same port would split the traffic: it is refused.
        second = subprocess.run(
            [*SERVE, "--config", str(path), "--workers", "2", "--port", str(gw.port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 1 and "already listens" in second.stderr
        data = ladder.settings().model_dump(mode="json")
        data["tenants"] = [{"name": "default", "api_keys": ["sk-hup"]}]
        # Kept stamp: the workers' file watch would otherwise reload them without the signal.
        write_unseen_by_the_file_watch(path, data)
        assert gw.process is not None
        gw.process.send_signal(signal.SIGHUP)
        # Every worker reloads: fresh connections (spread over both) all accept the new key.
        assert every_worker_accepts(gw.url, "sk-hup")
        assert gw.process.poll() is None  # the supervisor lives on
    assert not list(scratch.glob("tiergate-metrics-*"))  # its folder went with it


@pytest.mark.slow
def test_an_admin_reload_reloads_every_worker(
    ladder: Ladder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = AdminSettings(token="admin-token")
    settings = ladder.settings().model_copy(update={"admin": admin})
    path = write_settings(tmp_path / "tiergate.yaml", settings)
    data = settings.model_dump(mode="json")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    process = GatewayProcess(path, env={"TMPDIR": str(tmp_path)})
    process.argv_extra = ["--workers", "2"]
    with process as gw:
        deadline = time.monotonic() + 60
        while listening_sockets(gw.port) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        data["tenants"] = [{"name": "default", "api_keys": ["sk-admin-reload"]}]
        write_unseen_by_the_file_watch(path, data)
        reply = send("POST", f"{gw.url}/admin/reload", {}, key="admin-token")
        assert reply.status == 200
        # The worker that answered, and the other one.
        assert every_worker_accepts(gw.url, "sk-admin-reload")
        # Each admin reload reloads each worker once: the worker that took it skips the
        # supervisor's echo of it (it reloaded twice, and answered reloads 1, 2, 4).
        counts = [reply.json()["reloads"]]
        for _ in range(2):
            time.sleep(1.0)  # the echo has come back
            counts.append(
                send("POST", f"{gw.url}/admin/reload", {}, key="admin-token").json()["reloads"]
            )
        assert counts == [1, 2, 3]
        # What runs, not the file's server settings (port 8000, one worker), after reloads.
        server = send("GET", f"{gw.url}/admin/config", key="admin-token").json()["server"]
        assert (server["port"], server["workers"]) == (gw.port, 2)


@pytest.mark.slow
def test_a_single_process_restart_does_not_report_the_last_runs_counters(
    ladder: Ladder, tmp_path: Path
) -> None:
    """`serve` without workers but with $PROMETHEUS_MULTIPROC_DIR set (as a deployment may
    export for every process) starts its counters from zero, as `--workers` does."""
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with GatewayProcess(path, env=env) as gw:
        assert send("POST", f"{gw.url}/v1/chat/completions", body).status == 200
        deadline = time.monotonic() + 5
        while requests_total(scrape(gw.url)) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert requests_total(scrape(gw.url)) == 1
    with GatewayProcess(path, env=env) as gw:
        assert requests_total(scrape(gw.url)) == 0


def _configmap_update(folder: Path, data: dict[str, object], version: int) -> None:
    """What the kubelet does to a ConfigMap volume: the file is a link through `..data` to a
    timestamped folder; an update writes a new folder, swaps `..data` and deletes the old."""
    import yaml

    new = folder / f"..v{version}"
    new.mkdir()
    (new / "tiergate.yaml").write_text(yaml.safe_dump(data))
    swap = folder / "..data_tmp"
    swap.symlink_to(new.name)
    os.replace(swap, folder / "..data")
    if version:
        import shutil

        shutil.rmtree(folder / f"..v{version - 1}")
    else:
        (folder / "tiergate.yaml").symlink_to("..data/tiergate.yaml")


@pytest.mark.slow
def test_workers_follow_a_configmap_update_through_its_symlinks(
    ladder: Ladder, tmp_path: Path
) -> None:
    """The supervisor and its workers watch the path as given: resolved once, it named a
    folder the next ConfigMap update deletes, so every later edit went unseen and a
    replacement worker started from the last valid copy."""
    folder = tmp_path / "configmap"
    folder.mkdir()
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [{"name": "default", "api_keys": [API_KEY]}]
    _configmap_update(folder, data, 0)
    metrics_dir = tmp_path / "metrics"
    process = GatewayProcess(
        folder / "tiergate.yaml", env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    process.argv_extra = ["--workers", "2"]
    with process:
        deadline = time.monotonic() + 20
        while len(worker_pids(metrics_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        data["tenants"] = [{"name": "default", "api_keys": [API_KEY, "sk-updated"]}]
        _configmap_update(folder, data, 1)
        assert every_worker_accepts(
            process.url, "sk-updated"
        )  # both workers' file watches saw the new folder
        data["tenants"] = [{"name": "default", "api_keys": ["sk-second"]}]
        _configmap_update(folder, data, 2)
        assert every_worker_accepts(process.url, "sk-second")
        time.sleep(1.5)  # the supervisor's watch copies it as the last valid configuration
        before = worker_pids(metrics_dir)
        os.kill(min(before), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not worker_pids(metrics_dir) - before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker_pids(metrics_dir) - before  # a replacement started, on the new keys
        assert every_worker_accepts(process.url, "sk-second")
