"""`tiergate serve --workers N`: one gateway process per core, each with its own
SO_REUSEPORT listening socket.

Why not uvicorn's own worker mode: it shares one listening socket, and uvloop accepts
greedily, so under load one worker takes nearly every connection while the others idle.
With a socket per worker the kernel spreads new connections by a hash of the 4-tuple.
The supervisor restarts a worker that dies and drains them all on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from types import FrameType

import uvicorn
from prometheus_client import multiprocess as prometheus_multiprocess

RESTART_BACKOFF_S = 1.0
STOP_GRACE_S = 35.0  # uvicorn's graceful shutdown (30 s) plus a margin
# A worker that dies this soon after its start failed to start; this many such failures in a
# row stop the supervisor instead of restarting forever.
FAILED_START_S = 10.0
MAX_FAILED_STARTS = 5
WATCH_INTERVAL_S = 1.0


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _accepting(host: str, port: int) -> bool:
    """Whether something accepts connections on (host, port); a wildcard host is probed on
    the loopback address."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_worker(target: Callable[[str, int], None], host: str, port: int) -> None:
    """What a spawned worker runs first. Until the gateway installs its reload handler, a
    SIGHUP the supervisor forwards would end the worker (the default action): it is ignored,
    the file read at start being the current one anyway. The supervisor spawned this process
    with SIGHUP blocked, so one that came while the interpreter started is dropped here."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    target(host, port)


def _worker_main(host: str, port: int) -> None:
    from gateway.app import create_app_from_env
    from gateway.launcher import die_with_parent, freeze_startup_heap, gateway_server_options

    die_with_parent()
    sock = reuseport_socket(host, port)
    app = create_app_from_env(host, port)
    freeze_startup_heap()
    # Ctrl-C reaches the whole process group; the supervisor drains the workers with SIGTERM,
    # so a worker's uvicorn re-raising SIGINT after its graceful exit is no error.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(uvicorn.Config(app, **gateway_server_options())).run(sockets=[sock])


class WorkerSupervisor:
    """Starts `count` workers, restarts the ones that die, stops them all on a signal."""

    def __init__(
        self,
        host: str,
        port: int,
        count: int,
        target: Callable[[str, int], None] | None = None,
        *,
        watch: Callable[[], object] | None = None,
    ) -> None:
        self.host = host
        self.count = count
        self.target = target or _worker_main  # what a worker runs: (host, port)
        # Called about once a second and before every replacement worker starts (it keeps
        # the last valid configuration current).
        self.watch = watch or (lambda: None)
        # SO_REUSEPORT lets a second supervisor bind the same port and split the traffic
        # with this one's workers: refuse when something already answers there.
        if port and _accepting(host, port):
            raise OSError(errno.EADDRINUSE, f"something already listens on {host}:{port}")
        # Binding here (without listening) reserves the port, resolves port 0 and fails
        # early with a clear error when the address is taken; it never receives traffic.
        self._reservation = reuseport_socket(host, port)
        self.port = int(self._reservation.getsockname()[1])
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[SpawnProcess] = []
        self._started: dict[int | None, float] = {}
        self._stopping = False

    def _spawn(self) -> SpawnProcess:
        process = self._context.Process(
            target=_start_worker, args=(self.target, self.host, self.port), name="tiergate-worker"
        )
        # The blocked mask survives fork and exec: a reload forwarded while the new
        # interpreter starts (before it can ignore SIGHUP) waits instead of ending it, and
        # one for the supervisor itself comes when the mask is restored.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._started[process.pid] = time.monotonic()
        return process

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _forward_reload(self, signum: int, frame: FrameType | None) -> None:
        # SIGHUP means "reload" to a single gateway; here every worker reloads itself.
        for process in self._workers:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGHUP)

    def run(self) -> None:
        """Supervises until SIGTERM or Ctrl-C; raises RuntimeError when workers keep dying at
        start-up (after stopping the others)."""
        handlers = {
            signal.SIGTERM: self._request_stop,
            signal.SIGINT: self._request_stop,
            signal.SIGHUP: self._forward_reload,
        }
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        failed_starts = 0
        next_watch = time.monotonic() + WATCH_INTERVAL_S
        try:
            self._workers = [self._spawn() for _ in range(self.count)]
            while not self._stopping:
                for index, process in enumerate(self._workers):
                    if process.is_alive() or self._stopping:
                        continue
                    _forget_live_gauges(process.pid)
                    lived = time.monotonic() - self._started.pop(process.pid or 0, 0.0)
                    failed_starts = failed_starts + 1 if lived < FAILED_START_S else 0
                    if failed_starts >= MAX_FAILED_STARTS:
                        raise RuntimeError(
                            f"{failed_starts} workers in a row exited within "
                            f"{FAILED_START_S:.0f} s of starting (last exit code "
                            f"{process.exitcode}); stopping. Their error is in the log above."
                        )
                    time.sleep(RESTART_BACKOFF_S)
                    self.watch()
                    self._workers[index] = self._spawn()
                if time.monotonic() >= next_watch:
                    self.watch()
                    next_watch = time.monotonic() + WATCH_INTERVAL_S
                time.sleep(0.2)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        for process in self._workers:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self._workers:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
            _forget_live_gauges(process.pid)
        self._reservation.close()


def reload_sibling_workers() -> bool:
    """In a worker of `serve --workers N`: asks the supervisor to reload every worker (it
    forwards SIGHUP to each; this one skips its echo). An admin reload reaches only the worker that
    took the connection, and the others' file watch misses what changes beside the config
    file (a retrained router model in `router.model_dir`). False outside a worker."""
    from gateway.launcher import PARENT_PID_ENV

    supervisor = os.environ.get(PARENT_PID_ENV)
    # Only our own parent: a variable inherited from elsewhere must not signal a stranger.
    if not supervisor or supervisor != str(os.getppid()):
        return False
    try:
        os.kill(int(supervisor), signal.SIGHUP)
    except (ProcessLookupError, ValueError):
        return False
    return True


def _forget_live_gauges(pid: int | None) -> None:
    """Drops a dead worker's live-mode gauge files (`livesum`, `livemax`): the merged
    exposition reads every file in the directory, so a dead worker's regime and flag gauges
    would otherwise count until the supervisor stops."""
    if pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        prometheus_multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


__all__ = ["WorkerSupervisor", "reload_sibling_workers", "reuseport_socket"]
