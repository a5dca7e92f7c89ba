#!/usr/bin/env bash
# gRPC plaintext vs gRPC over TLS vs the QUIC rung (issue 13), all through the
# client library (`infermesh bench --registry ... --transport grpc|quic`), to
# agents fronting a test worker that serves `identity` (OUTPUT0 = INPUT0), at
# 1 KiB, 1 MiB and 16 MiB, concurrency 1 and 16.
#
#   scripts/bench-tls-quic.sh [DURATION]          loopback (default 3s per run)
#   scripts/bench-tls-quic.sh [DURATION] --link   also on a constrained link:
#       the agents in a network namespace joined to this one by a veth pair
#       whose both ends are shaped by `tbf` (RATE, default 200mbit) over a
#       short `pfifo` (20 packets), so packets really drop. Needs root; the
#       namespace, the veth pair and every process are removed on exit.
# SIZES="..." and CONCS="..." choose other sizes (bytes) and concurrencies;
# ROUNDS=N repeats every cell N times, interleaved (default 1).
# PERF_DIR=DIR also profiles the TLS agent and the bench process of every
# gRPC+TLS and QUIC cell with `perf record` (flat, 999 Hz) into
# DIR/<mode>-<size>-<conc>-<round>.{agent,bench}.data.
#
# Certificates are made with openssl in a scratch directory (deleted on exit).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-3s}
link=${2:-}
rate=${RATE:-200mbit}
cargo build --release --locked -q -p infermesh -p infermesh-testworker
bin=$PWD/target/release
. scripts/lib.sh
dir=$(mktemp -d /tmp/infermesh-bench-tls.XXXXXX)
pids=()
ns=imbench$$
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$link" ]; then
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip link del imb-root 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

# Where the agents listen and how to run them.
host=127.0.0.1
run_ns=()
if [ -n "$link" ]; then
  ip netns add "$ns"
  ip link add imb-root type veth peer name imb-srv
  ip link set imb-srv netns "$ns"
  ip addr add 10.99.0.2/24 dev imb-root
  ip link set imb-root up
  ip netns exec "$ns" ip addr add 10.99.0.1/24 dev imb-srv
  ip netns exec "$ns" ip link set imb-srv up
  ip netns exec "$ns" ip link set lo up
  for side in "" "ip netns exec $ns"; do
    dev=$([ -z "$side" ] && echo imb-root || echo imb-srv)
    $side tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst 64kb latency 50ms
    $side tc qdisc add dev "$dev" parent 1:1 handle 10: pfifo limit 20
  done
  host=10.99.0.1
  run_ns=(ip netns exec "$ns")
fi

# A CA and the agents' certificate (IP SANs: loopback and the namespace side).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=bench-ca -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=agent \
  -keyout "$dir/agent.key" -out "$dir/agent.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:10.99.0.1\nextendedKeyUsage=serverAuth\n' > "$dir/ext"
openssl x509 -req -in "$dir/agent.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 1 -extfile "$dir/ext" -out "$dir/agent.pem" 2>/dev/null

# ZooKeeper where the agents can reach it.
start_zookeeper "$dir" "$([ -n "$link" ] && echo 10.99.0.2 || echo 127.0.0.1)"

# One plaintext agent (service "plain") and one with TLS and QUIC ("tls").
agent() { # NAME EXTRA-TOML
  local oip admin
  oip=$(port); admin=$(port)
  cat > "$dir/$1.toml" <<EOF
node_id = "$1"
listen = "$host:$oip"
admin_listen = "$host:$admin"
threads = 2
max_message_bytes = 67108864
[registry]
url = "$registry"
service = "$1"
[[workers]]
command = "$bin/infermesh-testworker --listen 127.0.0.1:{port} --model identity"
$2
EOF
  "${run_ns[@]}" "$bin/infermesh" agent --config "$dir/$1.toml" 2>"$dir/$1.log" &
  pids+=($!)
  agent_pid=$!
}
agent plain ""
agent tls "[transport]
quic = \"on\"
[tls]
cert = \"$dir/agent.pem\"
key = \"$dir/agent.key\""
tls_agent=$agent_pid # (`ip netns exec` execs the agent: the same pid)

for service in plain tls; do
  for _ in $(seq 300); do
    "$bin/infermesh" nodes --registry "$registry" --service "$service" --json 2>/dev/null |
      grep -q '"identity"' && break
    sleep 0.2
  done
done

printf '%-10s %9s %4s %5s %9s %11s %9s %9s %8s\n' mode size conc round req/s 'MiB/s in' 'p50 ms' 'p99 ms' fallback
for round in $(seq "${ROUNDS:-1}"); do
for size in ${SIZES:-1024 1048576 16777216}; do
  for conc in ${CONCS:-1 16}; do
    for mode in grpc grpc+tls quic; do
      case $mode in
        grpc) args=(--service plain --transport grpc) ;;
        grpc+tls) args=(--service tls --tls-ca "$dir/ca.pem" --transport grpc) ;;
        quic) args=(--service tls --tls-ca "$dir/ca.pem" --transport quic) ;;
      esac
      "$bin/infermesh" bench --registry "$registry" "${args[@]}" --model identity \
        --size-bytes "$size" --concurrency "$conc" --duration "$duration" --warmup 1s \
        --timeout 60s --wait-ready 60s --json >"$dir/run.json" 2>/dev/null &
      bench=$!
      if [ -n "${PERF_DIR:-}" ] && [ "$mode" != grpc ]; then
        mkdir -p "$PERF_DIR"
        sleep 1.5 # past the warm-up
        secs=$(( ${duration%s} > 2 ? ${duration%s} - 1 : 1 ))
        tag="$PERF_DIR/$mode-$size-$conc-$round"
        perf record -q -F 999 -p "$tls_agent" -o "$tag.agent.data" -- sleep "$secs" 2>/dev/null &
        perf record -q -F 999 -p "$bench" -o "$tag.bench.data" -- sleep "$secs" 2>/dev/null || true
        wait $! || true
      fi
      wait "$bench" || true
      tail -1 "$dir/run.json" |
        MODE=$mode CONC=$conc ROUND=$round python3 -c '
import json, os, sys
r = json.load(sys.stdin)
fb = sum(v["fallbacks"] for v in r["paths"].values())
used = ",".join(k for k, v in r["paths"].items() if v["successes"])
print("%-10s %9d %4s %5s %9.0f %11.1f %9.3f %9.3f %8d %s" % (os.environ["MODE"], r["size_bytes"], os.environ["CONC"],
      os.environ["ROUND"], r["throughput_rps"], r["bytes_per_s"] / 2**20, r["latency_ms"]["p50"],
      r["latency_ms"]["p99"], fb, used))' ||
        echo "$mode $size $conc: failed (see $dir)"
    done
  done
done
done
