#!/usr/bin/env bash
# Issue 24's HTTP/2 attacks and issue 27's trickle-upload (tests/src/h2attack,
# the `h2-attack` binary; `h2-attack list` names them), each for
# ATTACK_DURATION against a fresh agent (release build, one test
# worker) and against nghttpd (Debian's nghttp2-server, plaintext, a docroot
# with index.html and an 8 MiB big.bin), with a good client alongside on
# its own connection: `infermesh bench` (1 s deadline) against the agent,
# `h2-attack good` (GETs, 1 s deadline) against nghttpd.
#
# Per attack and server: the good client's p99 and errors during the attack
# beside its quiet p99, the server's CPU seconds after the attack's first
# second (/proc/PID/stat) beside what the good client alone costs it over
# the same time, its RSS before and after, and when (and how) the
# connection was closed. One JSON line each, then the table for
# docs/HARDENING.md.
#
#   scripts/h2-attacks.sh                          # all attacks, ~10 min
#   ATTACK_DURATION=5s ATTACKS="rapid-reset ping-flood" scripts/h2-attacks.sh
#   SERVERS=agent scripts/h2-attacks.sh            # the agent only
#   AGENT_BIN=/old/target/release scripts/h2-attacks.sh
#                                   # infermesh + testworker built elsewhere (a "before" row)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${ATTACK_DURATION:-12s}
servers=${SERVERS:-agent nghttpd}

. scripts/lib.sh
need nghttpd nghttp2-server
# Two builds: `--bin` would narrow the first to the attack binary alone.
cargo build --release --locked -q -p infermesh -p infermesh-testworker
cargo build --release --locked -q -p infermesh-tests --bin h2-attack
bin=target/release
agent_bin=${AGENT_BIN:-$bin}
attacks=${ATTACKS:-$("$bin/h2-attack" list)}
scratch

mkdir -p "$work/docroot"
echo '<!DOCTYPE html><title>infermesh h2 reference</title>' >"$work/docroot/index.html"
head -c $((8 << 20)) /dev/zero >"$work/docroot/big.bin"

cpu() { awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"; }
rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# start SERVER: starts a fresh server; sets `pid` and `addr`.
start() {
  local p a
  p=$(port)
  if [ "$1" = agent ]; then
    a=$(port)
    "$agent_bin/infermesh" agent --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$a" --node-id attacked \
      --worker "$agent_bin/infermesh-testworker --listen 127.0.0.1:{port} --model dense --model identity" \
      2>>"$work/agent.log" &
    pid=$!
    addr=127.0.0.1:$p
    "$bin/infermesh" bench --target "$addr" --duration 1s --wait-ready 30s >/dev/null
  else
    nghttpd --no-tls -a 127.0.0.1 -d "$work/docroot" "$p" >/dev/null 2>&1 &
    pid=$!
    addr=127.0.0.1:$p
    for _ in $(seq 100); do "$bin/h2-attack" good --target "$addr" --server web --duration 100ms >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  pids+=("$pid")
}

stop() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }

# good SERVER DURATION: the good client's JSON report.
good() {
  if [ "$1" = agent ]; then
    "$bin/infermesh" bench --target "$addr" --duration "$2" --warmup 0s --timeout 1s --json | tail -1
  else
    "$bin/h2-attack" good --target "$addr" --server web --duration "$2"
  fi
}

results=$work/results.jsonl
for server in $servers; do
  kind=agent
  [ "$server" = nghttpd ] && kind=web
  # The good client alone for as long as an attack: its p99, and what
  # serving it costs the server (the CPU column's baseline).
  start "$server"
  good "$server" "$duration" >"$work/quiet.json" &
  gpid=$!
  sleep 1
  cpu1=$(cpu "$pid")
  wait "$gpid"
  cpu2=$(cpu "$pid")
  quiet=$(python3 -c 'import json,sys; q=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); q["cpu_s_after_first_s"]=round(float(sys.argv[3])-float(sys.argv[2]),2); print(json.dumps(q))' "$work/quiet.json" "$cpu1" "$cpu2")
  stop
  for attack in $attacks; do
    start "$server"
    rss0=$(rss_mib "$pid")
    good "$server" "$duration" >"$work/good.json" &
    gpid=$!
    "$bin/h2-attack" "$attack" --target "$addr" --server "$kind" --duration "$duration" >"$work/attack.json" &
    apid=$!
    sleep 1
    cpu1=$(cpu "$pid")
    wait "$apid"
    # Until the good client's end (the attack may end sooner): the same
    # interval as the baseline's.
    wait "$gpid"
    cpu2=$(cpu "$pid")
    rss1=$(rss_mib "$pid")
    line=$(python3 - "$server" "$attack" "$cpu1" "$cpu2" "$rss0" "$rss1" "$work/attack.json" "$work/good.json" "$quiet" <<'PY'
import json, sys
server, attack, cpu1, cpu2, rss0, rss1, attack_file, good_file, quiet = sys.argv[1:]
print(json.dumps({
    "server": server, "attack": attack,
    "cpu_s_after_first_s": round(float(cpu2) - float(cpu1), 2),
    "rss_mib": [float(rss0), float(rss1)],
    "report": json.load(open(attack_file)),
    "good": json.loads(open(good_file).read().strip().splitlines()[-1]),
    "quiet": json.loads(quiet),
}))
PY
)
    echo "$line" | tee -a "$results"
    stop
  done
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| attack | server | good client p99 quiet → during | good client errors | server CPU s after 1st s (good client alone) | RSS MiB before → after | connection |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    rep, good, quiet = r["report"], r["good"], r["quiet"]
    g = rep["goaway"]
    if g:
        conn = f'GOAWAY {g["code"]} at {g["at_s"]:.3f} s after {g["streams_sent"]} streams / {g["frames_sent"]} frames'
    elif rep["closed_at_s"] is not None:
        conn = f'closed at {rep["closed_at_s"]:.3f} s after {rep["streams"]} streams / {rep["frames"]} frames'
    else:
        conn = f'open after {rep["seconds"]:.0f} s ({rep["streams"]} streams, {rep["frames"]} frames'
        if rep["blocked_s"] > 0.5:
            conn += f', writes blocked {rep["blocked_s"]:.1f} s'
        conn += ")"
    resets = ", ".join(f"{k} {v}" for k, v in rep["resets"].items())
    if resets:
        conn += f"; resets: {resets}"
    if rep["note"] and not rep["note"].endswith("steps") and "writes blocked" not in rep["note"]:
        conn += f'; {rep["note"]}'
    print(f'| {r["attack"]} | {r["server"]} | {quiet["latency_ms"]["p99"]:.2f} → {good["latency_ms"]["p99"]:.2f} ms '
          f'| {good["errors"]} of {good["requests"] + good["errors"]} | '
          f'{r["cpu_s_after_first_s"]:.2f} ({quiet["cpu_s_after_first_s"]:.2f}) | '
          f'{r["rss_mib"][0]:.1f} → {r["rss_mib"][1]:.1f} | {conn} |')
PY
