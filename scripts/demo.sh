#!/usr/bin/env bash
# The main job, on one machine: build, then `infermesh demo` — three agents with
# test workers of different speeds, load through the client library, a CUDA
# crash on the local node at 1/3 of the run and a slow remote node at 2/3, a
# live table and a summary (exit 0 when no request failed).
#
# Arguments go to `infermesh demo`, e.g.:
#   scripts/demo.sh --duration 15s
#   scripts/demo.sh --zookeeper zk://127.0.0.1:2181/infermesh   # needs a running ZooKeeper
#   scripts/demo.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
# The RDMA crate's build (rdma-mummy-sys) needs cmake and clang; install them
# on a fresh Debian machine (as root) if missing.
if ! command -v cmake >/dev/null 2>&1 || ! command -v clang >/dev/null 2>&1; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  # To stderr, as the build's output: with --json, stdout is the demo's JSON only.
  { $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq cmake clang libclang-dev; } >&2
fi
cargo build --locked --release -p infermesh -p infermesh-testworker >&2
exec target/release/infermesh demo "$@"
