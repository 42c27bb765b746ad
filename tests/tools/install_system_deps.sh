#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real: Prometheus (promtool too),
# docker-compose (validates compose files without an engine), wrk (benchmarks),
# redis-server (limits shared across gateway replicas), and gcc (the compiled router build,
# tests/router_models/test_compiled.py).
# Idempotent; quiet when everything is already there.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends keeps the install small; the prometheus service is not started here
# (the tests start their own server on a free port).
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
