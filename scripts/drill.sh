#!/usr/bin/env bash
# Fault drill: an agent with four test workers on four fake GPUs, default
# sentinel settings (probe every 1 s, 1 s timeout, 1 s kill grace) except a 1 s
# stable period, under load from `infermesh drill`, which injects each fault kind
# $COUNT times (quarantines: at most one per GPU worker but one) and prints
# detection and recovery times. The short stable period lets each injection
# meet a worker out of its crash loop (the drill waits for that), so it measures
# the response to one fault; the crash-loop backoff has its own tests.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-20}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=target/release
. scripts/lib.sh
oip=$(port); admin=$(port)
cfg=$(mktemp --suffix .toml)
token=$(mktemp)
head -c 32 /dev/urandom | base64 > "$token"
worker='infermesh-testworker --listen 127.0.0.1:{port} --service-time-ms 2'
{
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' "$oip" "$admin"
  printf '[sentinel]\nstable_period = "1s"\n'
  printf '[gpu]\nbackend = "fake"\nfake_devices = 4\n'
  for g in 0 1 2 3; do printf '[[workers]]\ncommand = "%s"\ngpu = %s\n' "$worker" "$g"; done
} > "$cfg"
"$bin/infermesh" agent --config "$cfg" --admin-token-file "$token" 2>/tmp/infermesh-drill-agent.log &
agent=$!
trap 'kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null; rm -f "$cfg" "$token"' EXIT
"$bin/infermesh" bench --target "127.0.0.1:$oip" --duration 200ms --warmup 0s --wait-ready 60s >/dev/null
"$bin/infermesh" drill --target "127.0.0.1:$oip" --admin "127.0.0.1:$admin" --admin-token-file "$token" --count "$count" --concurrency 4 --json "$@"
