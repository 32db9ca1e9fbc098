#!/usr/bin/env bash
# A local fleet: N attend-server replicas on free loopback ports behind nginx on 127.0.0.1:PORT,
# which routes every call about a sequence to the replica holding it (deploy/nginx/).
#
#   bash deploy/local/fleet.sh start [--replicas N] [--port P] [--tls_port T --tls_cert PEM
#                                     --tls_key PEM] [-- <attend-server flags>...]
#   bash deploy/local/fleet.sh status [--port P]
#   bash deploy/local/fleet.sh restart [--port P]
#   bash deploy/local/fleet.sh scale N [--port P]
#   bash deploy/local/fleet.sh stop [--port P]
#
# start prints one line per endpoint, once every replica's health is SERVING and the proxy
# answers:
#   proxy 127.0.0.1:P
#   proxy_tls 127.0.0.1:T                               (with --tls_port only)
#   replica 127.0.0.1:PORT metrics 127.0.0.1:PORT       (one per replica)
# Flags after `--` go to every replica, e.g. `-- --kv_cache_bytes=1GiB`; --address,
# --metrics_address, --handoff_target and --snapshot_dir are the script's (refused after `--`,
# with one dash or two): every replica hands its sequences off through the proxy
# (--handoff_target=127.0.0.1:P), and replicas cannot share one snapshot directory. Unless the
# flags name --simd_kernels, the first replica measures the decode kernel sets and every other
# replica, now and after restart and scale, runs the same ones (moves stay bit-identical).
#
# restart and scale change the fleet without losing a sequence. Each sequence moves to the
# replica that nginx's consistent hash maps its key to once the change is made (KvCache.HandOff,
# through the proxy; clients see at most a few refusals saying the sequence is moving, which the
# Python client's move_wait sends again):
#   restart  one replica at a time: take it out of nginx's list (reload), hand its sequences
#            off to the others, stop it, start it again on the same ports with the same flags
#            and binary as now (a rolling upgrade: rebuild, then restart), put it back (reload),
#            and have every other replica hand over what now maps to it.
#   scale N  N > now: start the new replicas, add them (reload), and the old ones hand over what
#            maps to the new ones. N < now: take the newest replicas out (reload), they hand all
#            their sequences to the others, then stop.
# A hand-off that leaves a sequence behind stops the change where it is, with the replica that
# still holds it in nginx's list (exit 1): nothing is lost, and the command may be run again.
# Numbers (--replicas 1..64, --port, --tls_port) are decimal, without leading zeros.
#
# Defaults: 3 replicas, port 50051. Binaries: $ATTEND_SERVER and $ATTEND_CLI, else
# $ATTEND_BUILD_DIR/server/attend-server and $ATTEND_BUILD_DIR/client/attend ($ATTEND_BUILD_DIR
# defaults to the repository's build/); nginx: $NGINX, else nginx on PATH or /usr/sbin/nginx.
# State (generated nginx config, logs, pids): $ATTEND_FLEET_DIR, default /tmp/attend-fleet-P.
# stop and status need the same --port (or ATTEND_FLEET_DIR) as start.
#
# Exit status: status 0 when every process of the fleet runs and nginx's list is exactly its
# replicas, 1 when one is gone (or nginx's master is gone and its workers are left: "orphaned"),
# or a replica is missing from nginx's list or listed without running; 3 when there is no fleet
# there (restart and scale too). One start, restart or scale runs at a time on a fleet (a second
# is refused, exit 1). A replica found gone is started again by restart and dropped by scale. stop is
# idempotent: 0 when it ended the fleet and also when there was none to end ("no fleet in DIR",
# e.g. already stopped, or a --port that names no fleet); check with status first when a wrong
# --port matters. Bad arguments: 1 (2 for usage).
#
# stop ends exactly the processes start started: each recorded pid is signalled only while it is
# still that process (same start time in /proc/PID/stat, same command line). nginx gets SIGTERM,
# replicas SIGTERM (they drain for their --shutdown_grace), anything left after 30 s SIGKILL.
# nginx runs in a process group of its own (setsid; the group's id is the master's pid): stop
# also ends the nginx processes left in that group, e.g. the workers of a master that was
# SIGKILLed (they keep the port and serve), and status reports them as orphaned.
set -euo pipefail

readonly MARKER=.attend-fleet
readonly STOP_WAIT_SECONDS=30
readonly START_WAIT_SECONDS=30
readonly RELOAD_WAIT_SECONDS=30

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(cd "$script_dir/../.." && pwd)
nginx_conf_dir="$repo_dir/deploy/nginx"

die() {
  echo "fleet.sh: $*" >&2
  exit 1
}

# usage [STATUS]: the header above as help, on stderr for a usage error (2), else stdout.
usage() {
  local status=${1:-2}
  if ((status == 0)); then
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  else
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
  fi
  exit "$status"
}

# take_lock: one start, restart or scale at a time on a fleet: two at once would each change
# nginx's list and move sequences by a ring the other is changing. The lock is fd 9 on
# $fleet_dir/lock, held until this script exits; the long-lived processes it starts get their fd
# 9 closed (9>&-), or they would hold it after.
take_lock() {
  exec 9>>"$fleet_dir/lock"
  flock -n 9 || die "another fleet.sh start, restart or scale is running on the fleet in" \
    "$fleet_dir; wait for it to end"
}

# Field 22 of /proc/PID/stat (start time in clock ticks since boot), or nothing when PID is gone
# or a zombie. With the pid it names one process for the life of the machine.
start_time() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${stat##*) }
  # shellcheck disable=SC2086  # split the fields on purpose
  set -- $rest
  [[ $1 == Z ]] && return 0
  echo "${20}"
}

cmdline() {
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true
}

# ours KIND PID START MATCH: PID is alive and still the process start recorded: same start time,
# and its command line starts with MATCH (a replica: the server binary) or contains it (nginx,
# which rewrites its title to "nginx: master process <argv>": the -c path).
ours() {
  local kind=$1 pid=$2 start=$3 match=$4 line
  [[ $(start_time "$pid") == "$start" ]] || return 1
  line=$(cmdline "$pid")
  if [[ $kind == replica ]]; then
    [[ $line == "$match "* ]]
  else
    [[ $line == *"$match"* ]]
  fi
}

gone() {
  [[ -z $(start_time "$1") ]]
}

# wait_gone SECONDS PID...: true when every PID has exited within SECONDS.
wait_gone() {
  local seconds=$1 pid deadline
  shift
  deadline=$((SECONDS + seconds))
  for pid in "$@"; do
    while ! gone "$pid"; do
      ((SECONDS < deadline)) || return 1
      sleep 0.05
    done
  done
}

port_in_use() {
  (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# nginx_group PID: the live nginx processes of the process group (and session) PID, which
# fleet.sh gives nginx's master with setsid: the master while it runs, and its workers, also
# after the master died (they are reparented but keep its group). A pid stays allocated while it
# names a process group, so no other process gets PID meanwhile; and the command line must be
# nginx's ("nginx: master process ...", "nginx: worker process").
nginx_group() {
  local group=$1 stat pid rest
  for stat in /proc/[0-9]*/stat; do
    rest=$(cat "$stat" 2>/dev/null) || continue
    pid=${stat#/proc/}
    pid=${pid%/stat}
    rest=${rest##*) }
    # shellcheck disable=SC2086  # split the fields on purpose: state ppid pgrp session
    set -- $rest
    [[ ${3:-} == "$group" && ${4:-} == "$group" && $1 != Z ]] || continue
    [[ $(cmdline "$pid") == "nginx: "* ]] && echo "$pid"
  done
  return 0
}

# ---- state --------------------------------------------------------------------------------------

port=50051
replicas=3
tls_port=""
tls_cert=""
tls_key=""
extra=()

# value FLAG ARGS...: the value of FLAG, the next argument; dies when there is none.
value() {
  (($# >= 2)) || die "$1 needs a value"
  printf '%s' "$2"
}

# decimal FLAG VALUE MIN MAX: dies unless VALUE is a decimal number in MIN..MAX written without
# leading zeros (bash would read 010 as octal, 08 not at all, and 0100 would be another state
# directory than 100).
decimal() {
  local flag=$1 number=$2 min=$3 max=$4
  if ! [[ $number =~ ^[1-9][0-9]{0,5}$ ]] || ((number < min || number > max)); then
    die "$flag: want a decimal number $min..$max without leading zeros, got '$number'"
  fi
}

parse_flags() {
  while (($#)); do
    case $1 in
      --port) port=$(value "$@"); shift 2 ;;
      --port=*) port=${1#*=}; shift ;;
      --replicas) replicas=$(value "$@"); shift 2 ;;
      --replicas=*) replicas=${1#*=}; shift ;;
      --tls_port) tls_port=$(value "$@"); shift 2 ;;
      --tls_port=*) tls_port=${1#*=}; shift ;;
      --tls_cert) tls_cert=$(value "$@"); shift 2 ;;
      --tls_cert=*) tls_cert=${1#*=}; shift ;;
      --tls_key) tls_key=$(value "$@"); shift 2 ;;
      --tls_key=*) tls_key=${1#*=}; shift ;;
      --) shift; extra=("$@"); break ;;
      -h|--help) usage 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
  decimal --port "$port" 1 65535
  decimal --replicas "$replicas" 1 64
  [[ -z $tls_port ]] || decimal --tls_port "$tls_port" 1 65535
  # The replicas' own flags may not choose their addresses, in any spelling absl reads: one or
  # two dashes, with `=value` or the value as the next argument.
  local flag
  for flag in "${extra[@]}"; do
    case $flag in
      -address|-address=*|--address|--address=*|-metrics_address|-metrics_address=*|\
      --metrics_address|--metrics_address=*)
        die "$flag: the fleet chooses the replicas' addresses" ;;
      -handoff_target|-handoff_target=*|--handoff_target|--handoff_target=*)
        die "$flag: the fleet's replicas hand their sequences off through its proxy" ;;
      -snapshot_dir|-snapshot_dir=*|--snapshot_dir|--snapshot_dir=*)
        die "$flag: replicas cannot share one snapshot directory; a fleet keeps its sequences" \
          "across restart and scale by moving them between replicas" ;;
    esac
  done
  fleet_dir=${ATTEND_FLEET_DIR:-/tmp/attend-fleet-$port}
  pids_file="$fleet_dir/pids"
}

# Prints each recorded process as "kind pid start port metrics match".
recorded() {
  [[ -f $pids_file ]] && cat "$pids_file"
  return 0
}

any_alive() {
  local kind pid start rest
  while read -r kind pid start rest; do
    [[ $kind == "#"* ]] && continue
    ours "$kind" "$pid" "$start" "${rest#* * }" && return 0
    [[ $kind == nginx && -n $(nginx_group "$pid") ]] && return 0
  done < <(recorded)
  return 1
}

# ---- start --------------------------------------------------------------------------------------

started_pids=()
nginx_pid=""

abort_start() {
  local pid
  for pid in "${started_pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # nginx's workers too: its process group (setsid), which only processes it forked are in.
  [[ -z $nginx_pid ]] || kill -KILL -- "-$nginx_pid" 2>/dev/null || true
  rm -f "$pids_file"
}

# names_kernels FLAG...: whether the flags choose the decode kernel sets (--simd_kernels).
names_kernels() {
  local flag
  for flag in "$@"; do
    case $flag in -simd_kernels|-simd_kernels=*|--simd_kernels|--simd_kernels=*) return 0 ;; esac
  done
  return 1
}

wait_for_startup_line() {
  local log=$1 pid=$2 deadline=$((SECONDS + START_WAIT_SECONDS))
  until grep -q "listening on" "$log" 2>/dev/null; do
    if gone "$pid"; then
      echo "fleet.sh: a replica exited at start-up; its output ($log):" >&2
      sed 's/^/  /' "$log" >&2
      return 1
    fi
    ((SECONDS < deadline)) || { echo "fleet.sh: no start-up line in $log" >&2; return 1; }
    sleep 0.05
  done
}

wait_serving() {
  local target=$1 what=$2 deadline=$((SECONDS + START_WAIT_SECONDS))
  until "$cli" --target="$target" --deadline=2 health >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "fleet.sh: $what at $target is not SERVING" >&2; return 1; }
    sleep 0.1
  done
}

cmd_start() {
  parse_flags "$@"
  local build_dir=${ATTEND_BUILD_DIR:-$repo_dir/build}
  server=${ATTEND_SERVER:-$build_dir/server/attend-server}
  cli=${ATTEND_CLI:-$build_dir/client/attend}
  nginx=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
  [[ -x $server ]] || die "no attend-server at $server (build it, or set ATTEND_BUILD_DIR)"
  [[ -x $cli ]] || die "no attend CLI at $cli (build target 'attend', or set ATTEND_CLI)"
  [[ -x $nginx ]] || die "no nginx at $nginx (set NGINX)"
  server=$(cd "$(dirname "$server")" && pwd)/$(basename "$server")
  if [[ -n $tls_port || -n $tls_cert || -n $tls_key ]]; then
    [[ -n $tls_port && -n $tls_cert && -n $tls_key ]] \
      || die "TLS needs all of --tls_port, --tls_cert and --tls_key"
    [[ -r $tls_cert && -r $tls_key ]] || die "cannot read $tls_cert or $tls_key"
    tls_cert=$(cd "$(dirname "$tls_cert")" && pwd)/$(basename "$tls_cert")
    tls_key=$(cd "$(dirname "$tls_key")" && pwd)/$(basename "$tls_key")
  fi

  if [[ -d $fleet_dir ]]; then
    if any_alive; then
      die "a fleet is already running in $fleet_dir (port $port; or nginx workers left by a" \
        "killed master: see status): 'fleet.sh stop --port $port' first"
    fi
    if [[ ! -e $fleet_dir/$MARKER ]] && [[ -n $(ls -A "$fleet_dir") ]]; then
      die "$fleet_dir exists and is not a fleet directory; choose another ATTEND_FLEET_DIR"
    fi
    rm -rf "${fleet_dir:?}"/*
  fi
  port_in_use "$port" && die "port $port on 127.0.0.1 is in use"
  [[ -n $tls_port ]] && port_in_use "$tls_port" && die "port $tls_port on 127.0.0.1 is in use"
  mkdir -p "$fleet_dir"
  touch "$fleet_dir/$MARKER"
  take_lock
  trap abort_start EXIT
  local line

  # The replicas; each picks free ports and prints them on its start-up line. The first one
  # measures the decode kernel sets (unless the flags name them) and the others, and every
  # replica restart and scale starts later, run the sets it chose: kernel sets sum in different
  # orders, and a sequence moved between replicas must decode bit for bit as it did.
  local i pid
  for ((i = 0; i < replicas; i++)); do
    "$server" --address=127.0.0.1:0 --metrics_address=127.0.0.1:0 \
      --handoff_target="127.0.0.1:$port" "${extra[@]}" \
      </dev/null >"$fleet_dir/replica-$i.log" 2>&1 9>&- &
    started_pids+=("$!")
    if ((i == 0)) && ! names_kernels "${extra[@]}"; then
      wait_for_startup_line "$fleet_dir/replica-0.log" "$!" || exit 1
      line=$(grep -m1 "listening on" "$fleet_dir/replica-0.log")
      [[ $line =~ ,\ kernels\ ([a-z0-9_:,]+), ]] || die "cannot read the kernels from: $line"
      extra+=("--simd_kernels=${BASH_REMATCH[1]}")
    fi
  done
  save_setup
  local ports=() metrics=()
  echo "# kind pid start_time port metrics_port command" >"$pids_file"
  for ((i = 0; i < replicas; i++)); do
    pid=${started_pids[i]}
    wait_for_startup_line "$fleet_dir/replica-$i.log" "$pid" || exit 1
    line=$(grep -m1 "listening on" "$fleet_dir/replica-$i.log")
    [[ $line =~ listening\ on\ [0-9.]+:([0-9]+),\ metrics\ on\ http://[0-9.]+:([0-9]+) ]] \
      || die "cannot read the ports from: $line"
    ports+=("${BASH_REMATCH[1]}")
    metrics+=("${BASH_REMATCH[2]}")
    echo "replica $pid $(start_time "$pid") ${ports[i]} ${metrics[i]} $server" >>"$pids_file"
  done
  for ((i = 0; i < replicas; i++)); do
    wait_serving "127.0.0.1:${ports[i]}" "replica $i" || exit 1
  done

  # nginx: the shared files as they are, the per-deployment ones generated.
  cp "$nginx_conf_dir/nginx.conf" "$nginx_conf_dir/grpc.conf" "$fleet_dir/"
  echo "listen 127.0.0.1:$port http2;" >"$fleet_dir/listen.conf"
  write_upstreams "${ports[@]}"
  if [[ -n $tls_port ]]; then
    cat >"$fleet_dir/tls.conf" <<EOF
# Written by deploy/local/fleet.sh (see deploy/nginx/tls.conf).
server {
    listen 127.0.0.1:$tls_port ssl http2;
    ssl_certificate $tls_cert;
    ssl_certificate_key $tls_key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:attend_tls:10m;
    include grpc.conf;
}
EOF
  else
    echo "# No TLS listener (fleet.sh start --tls_port)." >"$fleet_dir/tls.conf"
  fi
  local nginx_args=(-p "$fleet_dir/" -e stderr -c "$fleet_dir/nginx.conf")
  "$nginx" "${nginx_args[@]}" -g "pid $fleet_dir/nginx.pid;" -t >"$fleet_dir/nginx-test.log" 2>&1 \
    || die "nginx rejects the generated config: $(cat "$fleet_dir/nginx-test.log")"
  # In a session (and process group) of its own, whose id is nginx's pid: stop finds the workers
  # by it even when the master is gone (nginx_group). setsid execs nginx (it forks only when
  # already a group leader, which a background job of this non-interactive shell is not).
  setsid "$nginx" "${nginx_args[@]}" -g "pid $fleet_dir/nginx.pid; daemon off;" \
    </dev/null >"$fleet_dir/nginx.log" 2>&1 9>&- &
  pid=$!
  started_pids+=("$pid")
  nginx_pid=$pid
  local deadline=$((SECONDS + START_WAIT_SECONDS))
  until [[ $(cat "$fleet_dir/nginx.pid" 2>/dev/null) == "$pid" ]] && port_in_use "$port"; do
    if gone "$pid"; then
      die "nginx exited at start-up: $(cat "$fleet_dir/nginx.log")"
    fi
    ((SECONDS < deadline)) || die "nginx did not start listening on 127.0.0.1:$port"
    sleep 0.05
  done
  [[ -n $(nginx_group "$pid") ]] || die "nginx (pid $pid) is not in a process group of its own"
  echo "nginx $pid $(start_time "$pid") $port - -c $fleet_dir/nginx.conf" >>"$pids_file"
  # The proxy answers: a keyless health check through it reaches one of the replicas.
  wait_serving "127.0.0.1:$port" "the proxy" || exit 1
  trap - EXIT

  echo "proxy 127.0.0.1:$port"
  [[ -n $tls_port ]] && echo "proxy_tls 127.0.0.1:$tls_port"
  for ((i = 0; i < replicas; i++)); do
    echo "replica 127.0.0.1:${ports[i]} metrics 127.0.0.1:${metrics[i]}"
  done
}

# ---- restart / scale ----------------------------------------------------------------------------

# What restart and scale need from start: the binaries, and the replicas' own flags (NUL-separated,
# so that any flag value survives).
save_setup() {
  printf '%s\n%s\n%s\n' "$server" "$cli" "$nginx" >"$fleet_dir/binaries"
  printf '%s\0' "${extra[@]}" >"$fleet_dir/replica-flags"
}

load_setup() {
  [[ -s $pids_file ]] || { echo "fleet.sh: no fleet in $fleet_dir" >&2; exit 3; }
  take_lock
  ((${#extra[@]} == 0)) || die "the replicas keep the flags the fleet was started with"
  [[ -s $fleet_dir/binaries ]] || die "$fleet_dir has no record of its binaries (started by an" \
    "older fleet.sh): stop it and start it again"
  { read -r server; read -r cli; read -r nginx; } <"$fleet_dir/binaries"
  mapfile -d '' extra <"$fleet_dir/replica-flags"
  local kind pid start p m match
  while read -r kind pid start p m match; do
    [[ $kind == nginx ]] || continue
    ours nginx "$pid" "$start" "$match" || die "the fleet's nginx (pid $pid) is gone: see status"
    nginx_pid=$pid
  done < <(recorded)
  # Replicas that exited or were killed are not an error here: restart starts them again and
  # scale drops them (what they held is gone either way).
  gone_ports=()
  while read -r kind pid start p m match; do
    [[ $kind == replica ]] || continue
    ours replica "$pid" "$start" "$match" || gone_ports+=("$p")
  done < <(recorded)
}

# is_gone PORT: the replica on PORT was gone when load_setup looked.
is_gone() {
  local g
  for g in "${gone_ports[@]}"; do [[ $g == "$1" ]] && return 0; done
  return 1
}

# The replicas in the pids file, in its order, as "pid start port metrics match" lines.
replica_lines() {
  grep '^replica ' "$pids_file" | cut -d' ' -f2-
}

# write_upstreams PORT...: nginx's list of replicas (the consistent hash's ring): exactly these.
write_upstreams() {
  local p
  {
    echo "# Written by deploy/local/fleet.sh."
    for p in "$@"; do
      echo "server 127.0.0.1:$p max_fails=1 fail_timeout=10s;"
    done
  } >"$fleet_dir/upstreams.conf.new"
  mv "$fleet_dir/upstreams.conf.new" "$fleet_dir/upstreams.conf"
}

# reload_nginx: nginx reads upstreams.conf again (SIGHUP). Returns once the old workers are gone,
# so that no call is routed by the old list any more: they finish the calls they have and tell
# their clients to reconnect (HTTP/2 GOAWAY), to the new workers. Dies when nginx refuses the
# configuration (nothing changed then: nginx keeps the old one).
reload_nginx() {
  local args=(-p "$fleet_dir/" -e stderr -c "$fleet_dir/nginx.conf")
  "$nginx" "${args[@]}" -g "pid $fleet_dir/nginx.pid;" -t >"$fleet_dir/nginx-test.log" 2>&1 \
    || die "nginx rejects the new replica list: $(cat "$fleet_dir/nginx-test.log")"
  local old=() pid deadline=$((SECONDS + RELOAD_WAIT_SECONDS))
  mapfile -t old < <(nginx_group "$nginx_pid" | grep -vx "$nginx_pid")
  kill -HUP "$nginx_pid"
  for pid in "${old[@]}"; do
    while ! gone "$pid"; do
      if ((SECONDS >= deadline)); then
        echo "fleet.sh: nginx worker $pid still finishes calls ${RELOAD_WAIT_SECONDS}s after" \
          "the reload; going on" >&2
        return 0
      fi
      sleep 0.05
    done
  done
  # And the new workers are up.
  local now=()
  until mapfile -t now < <(nginx_group "$nginx_pid" | grep -vx "$nginx_pid") && ((${#now[@]})); do
    ((SECONDS < deadline)) || die "nginx started no workers after the reload"
    sleep 0.05
  done
}

# hand_off PORT: the replica there hands each of its sequences to the replica the proxy maps the
# sequence's key to now (its --handoff_target). False when one stayed behind.
hand_off() {
  local out rc=0
  out=$("$cli" --target="127.0.0.1:$1" --deadline=600 seq hand-off 2>&1) || rc=$?
  # shellcheck disable=SC2001  # a prefix on every line
  sed "s|^|  replica 127.0.0.1:$1 hand-off: |" <<<"$out"
  return "$rc"
}

# launch_replica PORT METRICS_PORT: starts a replica (0: free ports) with the fleet's flags,
# waits until it serves and records it; sets launched_pid, launched_port and launched_metrics.
launch_replica() {
  local n log pid line
  n=$(find "$fleet_dir" -maxdepth 1 -name 'replica-*.log' | wc -l)
  log="$fleet_dir/replica-$n.log"
  "$server" --address="127.0.0.1:$1" --metrics_address="127.0.0.1:$2" \
    --handoff_target="127.0.0.1:$port" "${extra[@]}" </dev/null >"$log" 2>&1 9>&- &
  pid=$!
  launched_pid=$pid
  if ! wait_for_startup_line "$log" "$pid"; then
    kill -KILL "$pid" 2>/dev/null || true
    exit 1
  fi
  line=$(grep -m1 "listening on" "$log")
  [[ $line =~ listening\ on\ [0-9.]+:([0-9]+),\ metrics\ on\ http://[0-9.]+:([0-9]+) ]] \
    || die "cannot read the ports from: $line"
  launched_port=${BASH_REMATCH[1]}
  launched_metrics=${BASH_REMATCH[2]}
  # Recorded before it is SERVING, so that stop ends it whatever happens next: in the place of
  # the replica it replaces on the same port (restart), else last.
  line="replica $pid $(start_time "$pid") $launched_port $launched_metrics $server"
  if grep -q "^replica [0-9]* [0-9]* $launched_port " "$pids_file"; then
    awk -v port="$launched_port" -v line="$line" \
      '$1 == "replica" && $4 == port { print line; next } { print }' \
      "$pids_file" >"$pids_file.new"
  else
    # Before nginx's line, as start writes them.
    awk -v line="$line" '$1 == "nginx" && !done { print line; done = 1 } { print }
      END { if (!done) print line }' "$pids_file" >"$pids_file.new"
  fi
  mv "$pids_file.new" "$pids_file"
  wait_serving "127.0.0.1:$launched_port" "replica $n" || exit 1
}

# forget_replica PORT: drops the replica on PORT from the pids file.
forget_replica() {
  grep -v "^replica [0-9]* [0-9]* $1 " "$pids_file" >"$pids_file.new" || true
  mv "$pids_file.new" "$pids_file"
}

# put_back_and_die PORT... -- MESSAGE: the ring becomes PORT... again, then dies with MESSAGE.
put_back_and_die() {
  local ring=()
  while [[ $1 != -- ]]; do ring+=("$1"); shift; done
  shift
  write_upstreams "${ring[@]}"
  reload_nginx
  die "$*"
}

cmd_restart() {
  parse_flags "$@"
  load_setup
  local lines=() ports=() line pid start p m match i o others failed
  mapfile -t lines < <(replica_lines)
  ((${#lines[@]} >= 2)) || die "restart needs 2 or more replicas: one has nowhere to hand its" \
    "sequences while it restarts (fleet.sh scale 2 first)"
  for line in "${lines[@]}"; do
    read -r pid start p m match <<<"$line"
    ports+=("$p")
  done
  # Replicas that are gone start again first, in their places; the rolling restart then goes
  # over the others, each of whose hand-offs also returns the keys of a restarted one.
  for line in "${lines[@]}"; do
    read -r pid start p m match <<<"$line"
    is_gone "$p" || continue
    echo "replica 127.0.0.1:$p was gone (exited or killed: what it held went with it);" \
      "starting it again"
    launch_replica "$p" "$m"
  done
  for line in "${lines[@]}"; do
    read -r pid start p m match <<<"$line"
    is_gone "$p" && continue
    others=()
    for o in "${ports[@]}"; do [[ $o == "$p" ]] || others+=("$o"); done
    echo "replica 127.0.0.1:$p: out of the proxy's list, handing its sequences off"
    write_upstreams "${others[@]}"
    reload_nginx
    hand_off "$p" || put_back_and_die "${ports[@]}" -- "replica 127.0.0.1:$p kept sequences" \
      "it could not hand off (above); it stays in the fleet, not restarted"
    stop_one replica "$pid" "$start" "$match" | sed 's/^/  /'
    launch_replica "$p" "$m"
    echo "replica 127.0.0.1:$p: restarted (pid $launched_pid), back in the list"
    write_upstreams "${ports[@]}"
    reload_nginx
    failed=0
    for o in "${others[@]}"; do hand_off "$o" || failed=1; done
    ((failed == 0)) || die "a replica kept sequences that now map to 127.0.0.1:$p (above):" \
      "they answer NOT_FOUND through the proxy until a hand-off moves them; run" \
      "'attend --target=<that replica> seq hand-off' or restart again"
  done
  cmd_status "$@"
}

# cmd_scale N FLAGS...
cmd_scale() {
  local wanted=$1
  shift
  parse_flags "$@"
  decimal "scale" "$wanted" 1 64
  load_setup
  local lines=() ports=() line pid start p m match o keep=() added=() failed=0
  mapfile -t lines < <(replica_lines)
  # Replicas that are gone leave the fleet first (what they held went with them).
  for line in "${lines[@]}"; do
    read -r pid start p m match <<<"$line"
    is_gone "$p" || continue
    echo "replica 127.0.0.1:$p was gone (exited or killed: what it held went with it);" \
      "dropped from the fleet"
    forget_replica "$p"
  done
  mapfile -t lines < <(replica_lines)
  for line in "${lines[@]}"; do
    read -r pid start p m match <<<"$line"
    ports+=("$p")
  done
  if ((wanted == ${#ports[@]})); then
    if ((${#gone_ports[@]})); then
      write_upstreams "${ports[@]}"
      reload_nginx
    fi
    echo "the fleet has $wanted replicas"
  elif ((wanted > ${#ports[@]})); then
    while ((${#ports[@]} + ${#added[@]} < wanted)); do
      launch_replica 0 0
      echo "replica 127.0.0.1:$launched_port: started (pid $launched_pid)"
      added+=("$launched_port")
    done
    write_upstreams "${ports[@]}" "${added[@]}"
    reload_nginx
    echo "the proxy's list has ${#ports[@]} + ${#added[@]} replicas; the others hand over what" \
      "maps to the new ones"
    for o in "${ports[@]}"; do hand_off "$o" || failed=1; done
    ((failed == 0)) || die "a replica kept sequences that now map to a new one (above): they" \
      "answer NOT_FOUND through the proxy until a hand-off moves them; run" \
      "'attend --target=<that replica> seq hand-off'"
  else
    # The newest go: the last in the pids file.
    keep=("${ports[@]:0:wanted}")
    write_upstreams "${keep[@]}"
    reload_nginx
    local i
    for ((i = wanted; i < ${#lines[@]}; i++)); do
      read -r pid start p m match <<<"${lines[i]}"
      echo "replica 127.0.0.1:$p: out of the proxy's list, handing its sequences off"
      # On a failure, this one and those not handed off yet go back in the list.
      hand_off "$p" || put_back_and_die "${keep[@]}" "${ports[@]:i}" -- "replica" \
        "127.0.0.1:$p kept sequences it could not hand off (above); it stays in the fleet"
      stop_one replica "$pid" "$start" "$match" | sed 's/^/  /'
      forget_replica "$p"
    done
  fi
  cmd_status "$@"
}

# ---- status / stop ------------------------------------------------------------------------------

cmd_status() {
  parse_flags "$@"
  [[ -s $pids_file ]] || { echo "no fleet in $fleet_dir"; exit 3; }
  local kind pid start p m match dead=0
  # The proxy first, as start prints them.
  while read -r kind pid start p m match; do
    if [[ $kind == nginx ]]; then
      printf 'proxy 127.0.0.1:%s' "$p"
    else
      printf 'replica 127.0.0.1:%s metrics 127.0.0.1:%s' "$p" "$m"
    fi
    if ours "$kind" "$pid" "$start" "$match"; then
      echo " pid $pid running"
    else
      echo -n " pid $pid gone"
      dead=1
      local orphans=()
      [[ $kind == nginx ]] && mapfile -t orphans < <(nginx_group "$pid")
      if ((${#orphans[@]})); then
        echo ", ${#orphans[@]} orphaned nginx worker(s) still running (pid ${orphans[*]}):" \
          "'fleet.sh stop' ends them"
      else
        echo
      fi
    fi
  done < <(grep '^nginx ' "$pids_file"; grep '^replica ' "$pids_file")
  # The proxy's list against the replicas: a restart or scale that did not finish can leave a
  # running replica out of it (its sequences unreachable through the proxy) or a gone one in it.
  local listed=() l
  [[ -f $fleet_dir/upstreams.conf ]] &&
    mapfile -t listed < <(sed -n 's/^server 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$fleet_dir/upstreams.conf")
  while read -r kind pid start p m match; do
    [[ $kind == replica ]] || continue
    local in_list=0
    for l in "${listed[@]}"; do [[ $l == "$p" ]] && in_list=1; done
    if ((in_list == 0)); then
      echo "replica 127.0.0.1:$p is not in the proxy's list: calls for its keys do not reach it" \
        "(a restart or scale did not finish: run it again)"
      dead=1
    fi
  done < <(recorded)
  for l in "${listed[@]}"; do
    if ! grep -q "^replica [0-9]* [0-9]* $l " "$pids_file"; then
      echo "the proxy's list has 127.0.0.1:$l, which is no replica of this fleet (a restart or" \
        "scale did not finish: run it again)"
      dead=1
    fi
  done
  return "$dead"
}

# stop_one KIND PID START MATCH: signals PID while it is still ours; prints what happened.
stop_one() {
  local kind=$1 pid=$2 start=$3 match=$4
  if ! ours "$kind" "$pid" "$start" "$match"; then
    echo "$kind pid $pid: already gone"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$STOP_WAIT_SECONDS" "$pid"; then
    if ours "$kind" "$pid" "$start" "$match"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "$kind pid $pid: killed (still running ${STOP_WAIT_SECONDS}s after SIGTERM)"
  else
    echo "$kind pid $pid: stopped"
  fi
}

# stop_nginx PID START MATCH: the master as stop_one, then whatever is left of its process group
# (its workers: they end with the master, or are orphans of a master that was killed).
stop_nginx() {
  local pid=$1 left=() worker
  stop_one nginx "$@"
  mapfile -t left < <(nginx_group "$pid")
  ((${#left[@]})) || return 0
  for worker in "${left[@]}"; do
    kill -TERM "$worker" 2>/dev/null || true
  done
  if wait_gone 5 "${left[@]}"; then
    echo "nginx workers of pid $pid (pid ${left[*]}): stopped"
    return 0
  fi
  mapfile -t left < <(nginx_group "$pid")
  for worker in "${left[@]}"; do
    kill -KILL "$worker" 2>/dev/null || true
  done
  echo "nginx workers of pid $pid (pid ${left[*]}): killed (still running 5s after SIGTERM)"
}

cmd_stop() {
  parse_flags "$@"
  [[ -s $pids_file ]] || { echo "no fleet in $fleet_dir"; return 0; }
  local kind pid start p m match
  # The proxy first (no new calls), then the replicas.
  while read -r kind pid start p m match; do
    [[ $kind == nginx ]] && stop_nginx "$pid" "$start" "$match"
  done < <(recorded)
  while read -r kind pid start p m match; do
    [[ $kind == replica ]] && stop_one "$kind" "$pid" "$start" "$match"
  done < <(recorded)
  rm -f "$pids_file"
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  status) shift; cmd_status "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  scale)
    shift
    if (($# == 0)) || [[ $1 == --* || $1 == -h ]]; then
      die "scale needs the number of replicas: fleet.sh scale N"
    fi
    cmd_scale "$@" ;;
  -h|--help) usage 0 ;;
  "") usage ;;
  *) die "unknown command '$1': start, stop, status, restart or scale" ;;
esac
