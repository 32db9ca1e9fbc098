#!/bin/sh
# k8s-upstreams.sh: the command of the proxy container in Kubernetes (deploy/k8s/proxy.yaml).
# It keeps nginx's upstream list (upstreams.conf) equal to the replicas of the StatefulSet that
# exist now, and runs nginx under it.
#
# Why: open-source nginx 1.22 resolves upstream names only when it starts or reloads, and refuses
# to start when one does not resolve. A fixed list of pods would keep the proxy from starting
# until every listed pod existed, never route to replicas the HPA adds, and keep sending to
# the old IP of a recreated pod.
#
# What it does (POSIX sh; runs on busybox, as in the nginx alpine image):
#   1. Copies nginx's files (every *.conf of $ATTEND_NGINX_SOURCE, the ConfigMap, except
#      upstreams.conf) into $ATTEND_NGINX_CONF_DIR, a writable emptyDir: nginx.conf includes
#      upstreams.conf from its own directory, and the ConfigMap is read-only.
#   2. Writes upstreams.conf there: one line
#        server <sts>-<i>.<service>.<namespace>.svc.<domain>:<port> max_fails=1 fail_timeout=10s;
#      for each i in 0 .. ATTEND_MAX_REPLICAS-1 whose name resolves now (the server line of
#      deploy/nginx/upstreams.conf). Names, not addresses: nginx's consistent hash places a
#      server on its ring by the name written here, so a replica keeps its keys when its pod is
#      recreated with another IP. When no name resolves, the list holds only a placeholder that
#      is marked down (an upstream without servers is invalid): nginx starts and answers every
#      call UNAVAILABLE (grpc.conf's @attend_unavailable), and the pod is not ready.
#   3. Starts nginx in the foreground (daemon off) as its child, and forwards SIGTERM, SIGQUIT
#      and SIGINT to it (nginx's fast shutdown, graceful shutdown, fast shutdown); it exits with
#      nginx's status once nginx has exited, for whatever reason.
#   4. Every ATTEND_RESOLVE_INTERVAL seconds resolves the names again. When the set of names that
#      resolve, or their addresses, changed, it writes the new upstreams.conf (atomically, by
#      rename), runs `nginx -t` and, when that passes, `nginx -s reload`, which resolves the
#      names anew. When `nginx -t` fails, the previous upstreams.conf is put back and nginx keeps
#      running on it; the change is tried again at the next round.
#   5. Keeps the file "ready" in $ATTEND_NGINX_CONF_DIR while the applied list has at least one
#      replica (the readiness probe tests for it).
#
# When the ring changes, keys move. `hash ... consistent` (ketama) moves only the keys of the
# server that joins or leaves: a replica added (the HPA scaling up) takes about 1/N of all keys
# (N replicas after the change) from the others, and a replica that stops resolving (deleted,
# scaled down, or not ready: the headless Service publishes ready pods only) hands its keys to
# the others. The calls about a sequence whose key moved reach a replica that never held it:
# NOT_FOUND (and a CreateSequence with that key creates it there). Clients recover as they do
# after a replica died: create the sequence again and prefill its tokens again (the client
# library's documented recovery, exercised in tests/e2e/fleet_test.py). When the replica comes
# back its keys move back to it. Each proxy pod resolves on its own, so for up to one interval
# two proxy pods can route a moved key differently.
#
# Environment (defaults in brackets):
#   POD_NAMESPACE            namespace of the StatefulSet: the pod's own, by the downward API [default]
#   ATTEND_MAX_REPLICAS      names tried, ordinals 0 .. N-1: the HPA's maxReplicas [8]
#   ATTEND_STATEFULSET       StatefulSet name [attend]
#   ATTEND_SERVICE           its headless Service [attend]
#   ATTEND_CLUSTER_DOMAIN    cluster DNS domain [cluster.local]
#   ATTEND_GRPC_PORT         the replicas' gRPC port [50051]
#   ATTEND_RESOLVE_INTERVAL  seconds between two rounds of resolving (may be fractional) [10]
#   ATTEND_RESOLVER          command run as `$ATTEND_RESOLVER NAME`, printing one line per
#                            address with the address first (as `getent hosts` does), nothing
#                            when NAME does not resolve ["getent hosts", else busybox nslookup]
#   ATTEND_NGINX_SOURCE      directory of nginx's files (the ConfigMap) [/etc/nginx/attend]
#   ATTEND_NGINX_CONF_DIR    writable directory nginx runs from [/etc/nginx/attend-live]
#   ATTEND_NGINX_PREFIX      nginx's -p prefix, temporary files and the pid file [/tmp/]
#   ATTEND_NGINX             the nginx binary [nginx] (not $NGINX: nginx itself reads that one,
#                            for sockets inherited on a binary upgrade)
set -u

namespace=${POD_NAMESPACE:-default}
max_replicas=${ATTEND_MAX_REPLICAS:-8}
statefulset=${ATTEND_STATEFULSET:-attend}
service=${ATTEND_SERVICE:-attend}
domain=${ATTEND_CLUSTER_DOMAIN:-cluster.local}
port=${ATTEND_GRPC_PORT:-50051}
interval=${ATTEND_RESOLVE_INTERVAL:-10}
resolver=${ATTEND_RESOLVER:-}
src_dir=${ATTEND_NGINX_SOURCE:-/etc/nginx/attend}
conf_dir=${ATTEND_NGINX_CONF_DIR:-/etc/nginx/attend-live}
prefix=${ATTEND_NGINX_PREFIX:-/tmp/}
nginx=${ATTEND_NGINX:-nginx}

log() {
  echo "k8s-upstreams: $*" >&2
}

die() {
  log "$*"
  exit 1
}

case $max_replicas in '' | *[!0-9]*) die "ATTEND_MAX_REPLICAS=$max_replicas is not a number" ;; esac
case $port in '' | *[!0-9]*) die "ATTEND_GRPC_PORT=$port is not a number" ;; esac
case $interval in '' | *[!0-9.]* | *.*.*) die "ATTEND_RESOLVE_INTERVAL=$interval is not a number of seconds" ;; esac
case $prefix in */) ;; *) prefix=$prefix/ ;; esac
pid_file=${prefix}nginx.pid
upstreams=$conf_dir/upstreams.conf

# The addresses NAME resolves to, one a line, sorted; nothing when it does not resolve.
resolve() {
  if [ -n "$resolver" ]; then
    $resolver "$1" 2>/dev/null  # unquoted: the variable may hold a command and its arguments
  elif command -v getent >/dev/null 2>&1; then
    getent hosts "$1" 2>/dev/null
  else
    # busybox: "Name: NAME" then "Address: A" (1.28+) or "Address 1: A NAME" (older) lines.
    nslookup "$1" 2>/dev/null |
      awk '/^Name:/ { named = 1; next } named && /^Address/ { sub(/^Address[^:]*:[ \t]*/, ""); print }'
  fi | awk 'NF { print $1 }' | sort -u
}

# Resolves every name. Sets state (what a change is detected on: "name=addr,addr," for each
# name that resolves), names (those names) and count.
scan() {
  state=
  names=
  count=0
  i=0
  while [ "$i" -lt "$max_replicas" ]; do
    name=$statefulset-$i.$service.$namespace.svc.$domain
    addrs=$(resolve "$name" | tr '\n' ',')
    if [ -n "$addrs" ]; then
      state="$state$name=$addrs "
      names="$names $name"
      count=$((count + 1))
    fi
    i=$((i + 1))
  done
}

# upstreams.conf for the last scan, to FILE.
write_upstreams() {
  {
    echo "# Written by k8s-upstreams.sh (deploy/nginx/k8s-upstreams.sh): the replicas of the"
    echo "# StatefulSet $statefulset whose names resolved ($count of ordinals 0..$((max_replicas - 1)))."
    echo "# max_fails=1 fail_timeout=10s as in deploy/nginx/upstreams.conf (grpc.conf: \"A replica"
    echo "# that dies\")."
    for name in $names; do
      echo "server $name:$port max_fails=1 fail_timeout=10s;"
    done
    if [ "$count" -eq 0 ]; then
      echo "# No replica resolves yet. An upstream needs a server: this one is never used (down),"
      echo "# so every call is answered UNAVAILABLE."
      echo "server 127.0.0.1:1 down;"
    fi
  } >"$1"
}

mark_ready() {
  if [ "$count" -gt 0 ]; then
    : >"$conf_dir/ready"
  else
    rm -f "$conf_dir/ready"
  fi
}

describe() {
  if [ "$count" -eq 0 ]; then
    echo "no replica resolves"
  else
    echo "$count replica(s):$names"
  fi
}

nginx_cmd() {
  "$nginx" -p "$prefix" -e stderr -c "$conf_dir/nginx.conf" "$@"
}

# Puts the last scan in place: new file, nginx -t, reload; or back to the old file.
apply() {
  write_upstreams "$upstreams.new" || return 1
  cp "$upstreams" "$upstreams.old" || return 1
  mv -f "$upstreams.new" "$upstreams" || return 1
  if ! out=$(nginx_cmd -g "pid $pid_file;" -t 2>&1); then
    mv -f "$upstreams.old" "$upstreams"
    log "nginx -t rejects the new upstreams ($(describe)), keeping the previous ones: $out"
    return 1
  fi
  rm -f "$upstreams.old"
  if ! nginx_cmd -g "pid $pid_file;" -s reload; then
    log "nginx -s reload failed ($(describe)); trying again next round"
    return 1
  fi
  applied=$state
  mark_ready
  log "reloaded: $(describe)"
}

# The loop that follows the replicas, in a child process. It ends on SIGTERM, or when the main
# process is gone.
follow() {
  sleep_pid=
  trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$interval" &
    sleep_pid=$!
    wait "$sleep_pid"
    kill -0 "$main_pid" 2>/dev/null || exit 0
    scan
    [ "$state" = "$applied" ] || apply
  done
}

main_pid=$$
nginx_pid=
follow_pid=
signal=
# A signal for the container: to nginx, and no more reloads while nginx shuts down.
# shellcheck disable=SC2317  # (run by the traps below)
forward() {
  signal=$1
  [ -z "$follow_pid" ] || kill "$follow_pid" 2>/dev/null
  if [ -n "$nginx_pid" ]; then
    log "SIG$1: passing it to nginx ($nginx_pid)"
    kill -s "$1" "$nginx_pid" 2>/dev/null
  fi
}
trap 'forward TERM' TERM
trap 'forward QUIT' QUIT
trap 'forward INT' INT

mkdir -p "$conf_dir" "$prefix" || die "cannot create $conf_dir or $prefix"
for f in "$src_dir"/*.conf; do
  [ -f "$f" ] || die "no nginx configuration in $src_dir"
  [ "${f##*/}" = upstreams.conf ] || cp "$f" "$conf_dir/" || die "cannot copy $f to $conf_dir"
done
[ -f "$conf_dir/nginx.conf" ] || die "no nginx.conf in $src_dir"

scan
write_upstreams "$upstreams" || die "cannot write $upstreams"
applied=$state
log "starting nginx: $(describe) (names $statefulset-N.$service.$namespace.svc.$domain," \
  "N < $max_replicas, resolved every ${interval}s)"
# Not through nginx_cmd: a function run in the background is a subshell, and $! would be its pid.
"$nginx" -p "$prefix" -e stderr -c "$conf_dir/nginx.conf" -g "pid $pid_file; daemon off;" &
nginx_pid=$!
# A signal that came before nginx existed.
[ -n "$signal" ] && kill -s "$signal" "$nginx_pid" 2>/dev/null
mark_ready

[ -n "$signal" ] || {
  follow &
  follow_pid=$!
}

status=1
while :; do
  wait "$nginx_pid"
  rc=$?
  if [ -n "$signal" ]; then
    # wait returns early (> 128) when a trapped signal comes: wait again for nginx's own status
    # (127: it was collected already).
    signal=
    [ "$rc" -eq 127 ] && break
    status=$rc
    continue
  fi
  status=$rc
  break
done
[ -z "$follow_pid" ] || kill "$follow_pid" 2>/dev/null
[ -z "$follow_pid" ] || wait "$follow_pid" 2>/dev/null
rm -f "$conf_dir/ready"
log "nginx exited with status $status"
exit "$status"
