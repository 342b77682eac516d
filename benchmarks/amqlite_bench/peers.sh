#!/usr/bin/env bash
# The peers `amqlite bench --vs` compares against: RabbitMQ and NATS, each on
# loopback, on its own non-default ports, under a private state directory, so a
# system RabbitMQ or NATS (if any) is never touched. It ships inside the harness
# (amqlite_bench/peers.sh), which runs it with bash; scripts/peers runs this file.
#
#   scripts/peers start [--no-install] [rabbitmq|nats ...]   # default: both
#   scripts/peers stop [rabbitmq|nats ...]
#   scripts/peers status [rabbitmq|nats ...]
#   scripts/peers install [rabbitmq|nats ...]
#
# `start` installs a missing server with apt-get (as root, or with sudo) unless
# --no-install, waits until it accepts connections (bounded), and records its
# pids; `stop` ends exactly those pids. `status` prints one line per peer:
#   rabbitmq running pid=1234 address=127.0.0.1:5682 dir=/tmp/amqlite-peers-0/rabbitmq
#   nats stopped
# (`start` prints the same line once a peer is ready). Exit status: 0 when every
# peer asked for is up (start/status) or down (stop); 3 when a server is not
# installed and --no-install was given; 1 on any other failure, with the reason
# on stderr.
#
# Ports (override with the variables named):
#   RabbitMQ  AMQP 127.0.0.1:5682 (PEERS_RABBITMQ_PORT), Erlang distribution
#             25682 (PEERS_RABBITMQ_DIST_PORT), its own epmd on 4379
#             (PEERS_EPMD_PORT); no plugins (so no management port). Never 5672.
#   NATS      127.0.0.1:4232 (PEERS_NATS_PORT), JetStream on, store in the
#             state dir; no monitoring or cluster port.
# State: PEERS_DIR (default ${TMPDIR:-/tmp}/amqlite-peers-$UID), wiped at start
# (RabbitMQ's is kept when PEERS_KEEP_STATE=1: a restart after kill -9).
set -euo pipefail

PEERS_DIR="${PEERS_DIR:-${TMPDIR:-/tmp}/amqlite-peers-$(id -u)}"
RABBITMQ_PORT="${PEERS_RABBITMQ_PORT:-5682}"
RABBITMQ_DIST="${PEERS_RABBITMQ_DIST_PORT:-25682}"
EPMD_PORT="${PEERS_EPMD_PORT:-4379}"
NATS_PORT="${PEERS_NATS_PORT:-4232}"
READY_TIMEOUT="${PEERS_READY_TIMEOUT:-90}"
STOP_TIMEOUT=15
ALL_PEERS=(rabbitmq nats)

die() { echo "peers: $*" >&2; exit 1; }

if [ "$RABBITMQ_PORT" = 5672 ]; then
  die "PEERS_RABBITMQ_PORT=5672 is RabbitMQ's default port: pick another (the bench never uses it)"
fi

package_of() {
  case "$1" in
    rabbitmq) echo rabbitmq-server ;;
    nats) echo nats-server ;;
  esac
}

rabbitmq_bin() { echo /usr/lib/rabbitmq/bin/rabbitmq-server; }

installed() {
  case "$1" in
    rabbitmq) [ -x "$(rabbitmq_bin)" ] && command -v erl >/dev/null 2>&1 ;;
    nats) command -v nats-server >/dev/null 2>&1 ;;
  esac
}

install_peer() {
  local peer="$1" pkg
  pkg="$(package_of "$peer")"
  installed "$peer" && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "$pkg is not installed and installing it needs root (no sudo here)"
    sudo=(sudo)
  fi
  echo "peers: installing $pkg with apt-get ..." >&2
  # Debian's postinst starts a system service only where an init system runs
  # and policy-rc.d allows it; ours never uses that service or its ports.
  if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >&2 ||
         { "${sudo[@]}" apt-get update -q >&2 &&
           "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >&2; }; }; then
    die "apt-get could not install $pkg"
  fi
  installed "$peer" || die "$pkg was installed but its server is not where expected"
}

# --- state -------------------------------------------------------------------------

dir_of() { echo "$PEERS_DIR/$1"; }

# pids recorded by `start`, one per line; the first is the server itself
recorded_pids() {
  local f
  f="$(dir_of "$1")/pids"
  [ -f "$f" ] && cat "$f" || true
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

server_pid() {
  local pid
  pid="$(recorded_pids "$1" | head -n 1)"
  if alive "$pid"; then echo "$pid"; fi
}

address_of() {
  case "$1" in
    rabbitmq) echo "127.0.0.1:$RABBITMQ_PORT" ;;
    nats) echo "127.0.0.1:$NATS_PORT" ;;
  esac
}

status_line() {
  local pid
  pid="$(server_pid "$1")"
  if [ -n "$pid" ]; then
    echo "$1 running pid=$pid address=$(address_of "$1") dir=$(dir_of "$1")"
  else
    echo "$1 stopped"
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait until $2 accepts connections while pid $3 lives; $1 names the peer
wait_ready() {
  local peer="$1" port="$2" pid="$3" deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! alive "$pid"; then
      echo "peers: $peer exited while starting; the end of its log:" >&2
      tail -n 15 "$(dir_of "$peer")/log/console.log" >&2 || true
      return 1
    fi
    if port_open "$port"; then return 0; fi
    sleep 0.2
  done
  echo "peers: $peer did not accept connections on port $port within ${READY_TIMEOUT}s" >&2
  tail -n 15 "$(dir_of "$peer")/log/console.log" >&2 || true
  return 1
}

refuse_taken_port() {
  if port_open "$2"; then
    die "$1: port $2 is already taken by another process (set PEERS_*_PORT to move it)"
  fi
}

# --- RabbitMQ ----------------------------------------------------------------------

start_rabbitmq() {
  local dir pid epmd_pid
  dir="$(dir_of rabbitmq)"
  refuse_taken_port rabbitmq "$RABBITMQ_PORT"
  refuse_taken_port "rabbitmq (distribution)" "$RABBITMQ_DIST"
  if [ "${PEERS_KEEP_STATE:-0}" = 1 ] && [ -d "$dir/mnesia" ]; then
    : # a restart over the last run's state (benchmarks/backlog.py: kill -9, restart)
  else
    rm -rf "$dir"
    mkdir -p "$dir/mnesia" "$dir/log" "$dir/home"
    : >"$dir/enabled_plugins.tmp"
    echo "[]." >"$dir/enabled_plugins"
    # a private cookie and a private epmd: nothing is shared with a system node
    head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/home/.erlang.cookie"
    chmod 400 "$dir/home/.erlang.cookie"
  fi
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RABBITMQ_PORT
loopback_users.guest = true
log.console = true
log.file = false
EOF
  export HOME="$dir/home"
  export ERL_EPMD_PORT="$EPMD_PORT"
  export ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_NODENAME="amqlite-bench@localhost"
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT="$RABBITMQ_PORT"
  export RABBITMQ_DIST_PORT="$RABBITMQ_DIST"
  export RABBITMQ_MNESIA_BASE="$dir/mnesia"
  export RABBITMQ_LOG_BASE="$dir/log"
  export RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
  export RABBITMQ_PID_FILE="$dir/rabbitmq.pid"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
  export RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
  : >"$RABBITMQ_CONF_ENV_FILE"
  # Two cores shared with the bench's clients: do not let idle schedulers spin
  # (RabbitMQ's runtime guide recommends this on shared or small machines).
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
  command -v epmd >/dev/null 2>&1 || die "rabbitmq: epmd not found (part of erlang-base)"
  epmd -port "$EPMD_PORT" -address 127.0.0.1 >"$dir/log/epmd.log" 2>&1 &
  epmd_pid=$!
  "$(rabbitmq_bin)" >"$dir/log/console.log" 2>&1 &
  pid=$!
  printf '%s\n%s\n' "$pid" "$epmd_pid" >"$dir/pids"
  if ! wait_ready rabbitmq "$RABBITMQ_PORT" "$pid"; then
    stop_peer rabbitmq >/dev/null
    return 1
  fi
  # the launcher may be a shell: record the Erlang VM (beam) as the server pid
  local beam
  beam="$(find_beam "$pid")"
  if [ -n "$beam" ] && [ "$beam" != "$pid" ]; then
    printf '%s\n%s\n%s\n' "$beam" "$pid" "$epmd_pid" >"$dir/pids"
  fi
}

# the beam.smp process at or below pid $1
find_beam() {
  local pid="$1" comm child
  for _ in 1 2 3 4 5; do
    comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
    case "$comm" in beam*) echo "$pid"; return 0 ;; esac
    child="$(cat /proc/"$pid"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m 1 . || true)"
    [ -n "$child" ] || break
    pid="$child"
  done
  echo "$1"
}

# --- NATS --------------------------------------------------------------------------

nats_version() { nats-server --version 2>/dev/null | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1; }

# JetStream fsyncs on every write only with `sync_interval: always` (nats-server >= 2.10)
nats_sync_always() {
  local v major minor
  v="$(nats_version)"
  major="${v%%.*}"; minor="${v#*.}"; minor="${minor%%.*}"
  [ -n "$v" ] && { [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 10 ]; }; }
}

start_nats() {
  local dir pid
  dir="$(dir_of nats)"
  refuse_taken_port nats "$NATS_PORT"
  rm -rf "$dir"
  mkdir -p "$dir/jetstream" "$dir/log"
  {
    echo "listen: 127.0.0.1:$NATS_PORT"
    echo "jetstream {"
    echo "  store_dir: \"$dir/jetstream\""
    if nats_sync_always; then echo "  sync_interval: always"; fi
    echo "}"
  } >"$dir/nats.conf"
  nats-server -c "$dir/nats.conf" >"$dir/log/console.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/pids"
  if ! wait_ready nats "$NATS_PORT" "$pid"; then
    stop_peer nats >/dev/null
    return 1
  fi
  if nats_sync_always; then echo always >"$dir/sync"; else echo "interval" >"$dir/sync"; fi
}

# --- commands ----------------------------------------------------------------------

start_peer() {
  local peer="$1" no_install="$2"
  if [ -n "$(server_pid "$peer")" ]; then
    status_line "$peer"
    return 0
  fi
  if ! installed "$peer"; then
    if [ "$no_install" = 1 ]; then
      echo "peers: $peer is not installed ($(package_of "$peer")); 'scripts/peers install $peer' installs it" >&2
      return 3
    fi
    install_peer "$peer"
  fi
  ("start_$peer") || return 1
  status_line "$peer"
}

stop_peer() {
  local peer="$1" pids pid deadline
  pids="$(recorded_pids "$peer")"
  [ -n "$pids" ] || { status_line "$peer"; return 0; }
  for pid in $pids; do
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  deadline=$((SECONDS + STOP_TIMEOUT))
  for pid in $pids; do
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  rm -f "$(dir_of "$peer")/pids"
  status_line "$peer"
}

usage() {
  sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

main() {
  [ $# -ge 1 ] || usage
  local cmd="$1" no_install=0 peers=() peer rc=0 status
  shift
  for arg in "$@"; do
    case "$arg" in
      --no-install) no_install=1 ;;
      rabbitmq | nats) peers+=("$arg") ;;
      -h | --help) usage ;;
      *) echo "peers: unknown peer or option '$arg' (peers: ${ALL_PEERS[*]})" >&2; exit 2 ;;
    esac
  done
  [ ${#peers[@]} -gt 0 ] || peers=("${ALL_PEERS[@]}")
  mkdir -p "$PEERS_DIR"
  case "$cmd" in
    start)
      for peer in "${peers[@]}"; do
        status=0
        start_peer "$peer" "$no_install" || status=$?
        if [ "$status" -ne 0 ] && [ "$rc" -ne 1 ]; then rc="$status"; fi
      done
      ;;
    stop) for peer in "${peers[@]}"; do stop_peer "$peer"; done ;;
    status)
      for peer in "${peers[@]}"; do
        status_line "$peer"
        [ -n "$(server_pid "$peer")" ] || rc=1
      done
      ;;
    install) for peer in "${peers[@]}"; do install_peer "$peer"; done ;;
    -h | --help | help) usage ;;
    *) echo "peers: unknown command '$cmd' (start|stop|status|install)" >&2; exit 2 ;;
  esac
  exit "$rc"
}

main "$@"
