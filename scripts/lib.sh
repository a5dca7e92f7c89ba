# Helpers the scripts share; sourced (`. scripts/lib.sh`), not run.

# need CMD PACKAGE: installs Debian's PACKAGE unless CMD is on the PATH.
need() { command -v "$1" >/dev/null || { echo "installing $2" >&2; apt-get install -y -q "$2" >/dev/null; }; }

# scratch: sets `work` to a new temporary directory and `pids` to an empty
# list; at exit, every pid in `pids` gets SIGTERM (and is waited for) and
# `work` is removed.
scratch() {
  work=$(mktemp -d)
  pids=()
  trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
}

# A loopback port nobody listens on right now.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_zookeeper DIR [HOST]: starts Debian's ZooKeeper with its data under
# DIR/zk on a free port of HOST (default 127.0.0.1), adds its pid to the
# caller's `pids`, waits until it answers `ruok`, and sets `registry` to
# zk://HOST:PORT/infermesh.
start_zookeeper() {
  local dir=$1 host=${2:-127.0.0.1} zkport
  zkport=$(port)
  mkdir -p "$dir/zk"
  printf 'tickTime=500\ndataDir=%s/zk\nclientPort=%s\nclientPortAddress=%s\nadmin.enableServer=false\n4lw.commands.whitelist=ruok\n' "$dir" "$zkport" "$host" > "$dir/zoo.cfg"
  java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ "$(python3 -c "import socket;s=socket.create_connection(('$host',$zkport),1);s.sendall(b'ruok');print(s.recv(4).decode())" 2>/dev/null)" = imok ] && break
    sleep 0.1
  done
  registry="zk://$host:$zkport/infermesh"
}

# haproxy_h2_cfg FILE PORT THREADS BACKEND: writes an HAProxy config that
# listens on 127.0.0.1:PORT with `proto h2` and THREADS threads, and whose
# one backend is the lines BACKEND (`server NAME ADDR proto h2 ...`, maybe a
# `balance`), as a user would put HAProxy in front of gRPC workers.
haproxy_h2_cfg() {
  local file=$1 listen=$2 threads=$3 backend=$4
  cat >"$file" <<CFG
global
  nbthread $threads
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend f
  bind 127.0.0.1:$listen proto h2
  default_backend b
backend b
$backend
CFG
}
