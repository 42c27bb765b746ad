"""A real Prometheus server on 127.0.0.1 for the tests, and its HTTP API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gateway.launcher import stop_processes
from tests.deploy.support import ALERTS, SCRAPE
from tests.helpers import free_port


def local_scrape_config(
    gateway: str, engines: dict[str, str], token_file: Path, interval: str = "1s"
) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with local targets and a fast interval.

    Jobs, paths, labels and credentials stay as checked in; only addresses, intervals, the
    rule file's path and the gateway's token file (`token_file`, which the compose
    Prometheus writes at start) change, so the test scrapes the way the compose setup does.
    """
    config = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(ALERTS)]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["tiergate"]["static_configs"] = [{"targets": [gateway]}]
    jobs["tiergate"]["authorization"]["credentials_file"] = str(token_file)
    for static in jobs["vllm"]["static_configs"]:
        static["targets"] = [engines[static["labels"]["tier"]]]
    return config


class PrometheusServer:
    """`prometheus` as a child process with its own data directory and a free port."""

    def __init__(self, binary: str, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("wb"),
            start_new_session=True,
        )
        self.log = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError("prometheus did not become ready")

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (or a one-element list for a scalar)."""
        try:
            data = self.api("query", query=expr)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr!r}: {exc.read().decode()}") from None
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_for(self, expr: str, count: int, timeout_s: float = 20.0) -> None:
        """Until `expr` returns at least `count` series."""
        deadline = time.monotonic() + timeout_s
        while len(self.query(expr)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} never returned {count} series")
            time.sleep(0.2)

    def stop(self) -> None:
        stop_processes([self.process])


__all__ = ["PrometheusServer", "local_scrape_config"]
