"""`tiergate serve --workers N`: one gateway process per core, each with its own
SO_REUSEPORT listening socket.

Why not uvicorn's own worker mode: it shares one listening socket, and uvloop accepts
greedily, so under load one worker takes nearly every connection while the others idle.
With a socket per worker the kernel spreads new connections by a hash of the 4-tuple.
The supervisor restarts a worker that dies and drains them all on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.context import SpawnProcess
from types import FrameType

import uvicorn

RESTART_BACKOFF_S = 1.0
STOP_GRACE_S = 35.0  # uvicorn's graceful shutdown (30 s) plus a margin


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _worker_main(host: str, port: int) -> None:
    from gateway.app import create_app_from_env
    from gateway.launcher import freeze_startup_heap, gateway_server_options

    sock = reuseport_socket(host, port)
    app = create_app_from_env()
    freeze_startup_heap()
    uvicorn.Server(uvicorn.Config(app, **gateway_server_options())).run(sockets=[sock])


class WorkerSupervisor:
    """Starts `count` workers, restarts the ones that die, stops them all on a signal."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.host = host
        self.count = count
        # Binding here (without listening) reserves the port, resolves port 0 and fails
        # early with a clear error when the address is taken; it never receives traffic.
        self._reservation = reuseport_socket(host, port)
        self.port = int(self._reservation.getsockname()[1])
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[SpawnProcess] = []
        self._stopping = False

    def _spawn(self) -> SpawnProcess:
        process = self._context.Process(
            target=_worker_main, args=(self.host, self.port), name="tiergate-worker"
        )
        process.start()
        return process

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def run(self) -> None:
        previous = {
            sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self._workers = [self._spawn() for _ in range(self.count)]
            while not self._stopping:
                for index, process in enumerate(self._workers):
                    if not process.is_alive() and not self._stopping:
                        time.sleep(RESTART_BACKOFF_S)
                        self._workers[index] = self._spawn()
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
        self._reservation.close()


__all__ = ["WorkerSupervisor", "reuseport_socket"]
