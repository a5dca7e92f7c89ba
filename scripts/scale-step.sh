#!/usr/bin/env bash
# `infermesh scale --watch` through a load step (issue 14): a ZooKeeper and four
# agents, each with one single-slot test worker (10 ms per request, so a node
# is busy while it serves one caller); closed-loop load through the client
# library steps 2 -> 8 -> 1 callers. Windows are shortened (up 10 s, down
# 20 s) so the run takes ~2.5 minutes; prints the advice at every change.
# Needs Debian's zookeeper package (.ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

start_zookeeper "$dir"
for n in 1 2 3 4; do
  "$bin/infermesh" agent --node-id "node-$n" --listen "127.0.0.1:$(port)" --admin-listen "127.0.0.1:$(port)" \
    --registry "$registry" --service step \
    --worker "$bin/infermesh-testworker --listen 127.0.0.1:{port} --service-time-ms 10 --concurrency 1" 2>"$dir/node-$n.log" &
  pids+=($!)
done
"$bin/infermesh" bench --registry "$registry" --service step --duration 200ms --warmup 0s --wait-ready 60s >/dev/null
sleep 2

"$bin/infermesh" scale --registry "$registry" --service step --watch --interval 2s \
  --up-window 10s --down-window 20s --json > "$dir/scale.jsonl" &
pids+=($!)
start=$(date +%s)
for step in "2 40s" "8 50s" "1 60s"; do
  set -- $step
  echo "$(( $(date +%s) - start ))s: $1 callers for $2" | tee -a "$dir/steps"
  "$bin/infermesh" bench --registry "$registry" --service step --concurrency "$1" --duration "$2" --warmup 0s >/dev/null
done
sleep 1
python3 - "$dir/scale.jsonl" "$start" <<'PY'
import json, sys, datetime
start = int(sys.argv[2])
last = None
print("| t (s) | serving | mean busy | advice |")
print("|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    t = int(datetime.datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()) - start
    a = r["advice"]
    what = a["advice"] + (f" to {a['to']}" if "to" in a else "")
    busy = "-" if r["busy_ratio"] is None else f"{r['busy_ratio']:.2f}"
    if what != last:
        print(f"| {t} | {r['serving']} | {busy} | {what} ({a.get('reason', '')}) |")
        last = what
PY
