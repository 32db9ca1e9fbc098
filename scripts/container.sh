#!/usr/bin/env bash
# Builds the attend container image and smoke-tests it, with docker or podman.
#
#   bash scripts/container.sh [build|smoke|all]     (default: all = build, then smoke)
#
#   ATTEND_IMAGE          image tag (default: attend:dev)
#   ATTEND_ENGINE         docker or podman (default: docker when its daemon answers, else podman)
#   ATTEND_JOBS           parallel compile jobs inside the build (default: 2)
#   ATTEND_GRPC_PORT      host port published for gRPC on 127.0.0.1 (default: a free one)
#   ATTEND_METRICS_PORT   host port published for /metrics on 127.0.0.1 (default: a free one)
#
# Needs docker or podman and the base image debian:bookworm-slim. Machines without a Docker engine
# or registry access (the development machines) get podman and a locally made base image from
# ../shared/tools/container-base.sh. CI does not run this script.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${ATTEND_IMAGE:-attend:dev}
jobs=${ATTEND_JOBS:-2}
what=${1:-all}
case "$what" in
  build | smoke | all) ;;
  *)
    echo "usage: $0 [build|smoke|all]" >&2
    exit 2
    ;;
esac

die() {
  echo "container: $*" >&2
  exit 1
}

engine=${ATTEND_ENGINE:-}
if [ -z "$engine" ]; then
  # A docker CLI without a reachable daemon (as on the development machines) does not count.
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null 2>&1; then
    engine=podman
  elif [ -f ../shared/tools/container-base.sh ]; then
    die "no docker engine and no podman; run: bash ../shared/tools/container-base.sh"
  else
    die "no docker engine and no podman: install one of them"
  fi
fi
command -v "$engine" >/dev/null 2>&1 || die "$engine is not installed"

build() {
  local args=(build -t "$image" --build-arg "ATTEND_JOBS=$jobs")
  # The revision goes in as a --label rather than a build arg in a LABEL step, which would
  # invalidate every layer after it. The compile step does take the short commit as a build arg,
  # for --version; a new commit usually changes the sources it compiles anyway.
  local revision src_url
  revision=$(git rev-parse HEAD 2>/dev/null || true)
  src_url=$(git config --get remote.origin.url 2>/dev/null || true)
  [ -n "$revision" ] && args+=(--label "org.opencontainers.image.revision=$revision"
    --build-arg "ATTEND_GIT_COMMIT=${revision:0:12}")
  [ -n "$src_url" ] && args+=(--label "org.opencontainers.image.source=$src_url")
  if [ "$engine" = podman ]; then
    # chroot isolation: this sandbox cannot nest the namespaces of the default OCI isolation.
    # docker format: the OCI format drops HEALTHCHECK. --pull=never: the base image is local.
    args+=(--isolation chroot --format docker --pull=never)
  fi
  echo "container: $engine build $image (jobs $jobs)"
  local start=$SECONDS
  "$engine" "${args[@]}" .
  echo "container: built $image in $((SECONDS - start)) s"
  "$engine" images "$image"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

smoke() {
  "$engine" image inspect "$image" >/dev/null 2>&1 || die "no image $image: run '$0 build' first"
  local grpc_port=${ATTEND_GRPC_PORT:-$(free_port)}
  local metrics_port=${ATTEND_METRICS_PORT:-$(free_port)}
  local name="attend-smoke-$$"
  # Remove the container however the smoke test ends (expanded now: the locals are gone at exit).
  # shellcheck disable=SC2064
  trap "$engine rm -f $name >/dev/null 2>&1; $engine rm -f $name-probe >/dev/null 2>&1; true" EXIT
  # Ctrl-C or a TERM (a timeout) must also pass through the EXIT trap.
  trap 'exit 130' INT TERM

  # Without systemd podman cannot put the health check on a timer and logs an error at every
  # run, stop and rm; DISABLE_HC_SYSTEMD is podman's own switch to skip the timer (podman 4.3
  # ignores --health-interval=disable for it). The check is run by hand below.
  if [ "$engine" = podman ] && [ ! -S /run/systemd/private ]; then export DISABLE_HC_SYSTEMD=true; fi
  echo "container: run $image as $name (gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port)"
  "$engine" run -d --name "$name" \
    -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" \
    "$image" --shutdown_grace=5s >/dev/null

  # Up to 60 s for the server and every service to report SERVING.
  local i
  for ((i = 0; ; i++)); do
    if "$engine" exec "$name" attend health >/dev/null 2>&1; then break; fi
    if [ "$("$engine" inspect -f '{{.State.Running}}' "$name")" != true ]; then
      "$engine" logs "$name" >&2 || true
      die "the container exited before it was healthy"
    fi
    ((i < 120)) || die "not SERVING after 60 s"
    sleep 0.5
  done
  "$engine" logs "$name"
  "$engine" exec "$name" attend health

  # The published gRPC port, from the host's network, with the image's own CLI.
  "$engine" run --rm --name "$name-probe" --network host --no-healthcheck \
    --entrypoint attend "$image" --target "127.0.0.1:$grpc_port" --deadline 5 health >/dev/null ||
    die "no healthy gRPC server on the published port 127.0.0.1:$grpc_port"
  echo "container: gRPC on 127.0.0.1:$grpc_port answers from the host: SERVING"

  local out
  out=$("$engine" exec "$name" attend softmax 2 1 0.5)
  echo "$out"
  for share in 0.628532 0.231224 0.140244; do
    grep -q "$share" <<<"$out" || die "softmax 2 1 0.5 does not print $share"
  done

  local metrics
  metrics=$(curl -fsS "http://127.0.0.1:$metrics_port/metrics") || die "no /metrics on :$metrics_port"
  grep -q '^grpc_server_handled_total' <<<"$metrics" ||
    die "/metrics has no grpc_server_handled_total"
  echo "container: /metrics on 127.0.0.1:$metrics_port has $(grep -c '^grpc_server_handled_total' \
    <<<"$metrics") grpc_server_handled_total series"

  # The server (PID 1) runs as the image's non-root user; `ps` is not in the image.
  local uid
  # shellcheck disable=SC2016
  uid=$("$engine" exec "$name" awk '/^Uid:/ {print $2}' /proc/1/status)
  [ "$uid" = 10001 ] || die "the server runs as uid $uid, not 10001"
  echo "container: PID 1 is $("$engine" exec "$name" cat /proc/1/comm), uid $uid" \
    "($("$engine" exec "$name" id -un))"

  if [ "$engine" = podman ]; then
    # Without systemd podman does not run the check on a timer; run it once by hand.
    "$engine" healthcheck run "$name" || die "HEALTHCHECK failed"
  else
    for ((i = 0; ; i++)); do
      [ "$("$engine" inspect -f '{{.State.Health.Status}}' "$name")" = healthy ] && break
      ((i < 60)) || die "HEALTHCHECK not healthy after 60 s"
      sleep 1
    done
  fi
  echo "container: health check: $("$engine" inspect -f '{{.State.Health.Status}}' "$name")"

  # SIGTERM to PID 1; the engine waits longer than the --shutdown_grace given above (which the
  # log line proves reached the server) before it would SIGKILL.
  "$engine" stop -t 20 "$name" >/dev/null
  local code logs
  code=$("$engine" inspect -f '{{.State.ExitCode}}' "$name")
  logs=$("$engine" logs "$name" 2>&1)
  tail -2 <<<"$logs"
  [ "$code" = 0 ] || die "exit code $code after SIGTERM, not 0"
  grep -q 'SIGTERM, draining for up to 5s' <<<"$logs" || die "no SIGTERM drain in the log"
  echo "container: stopped with SIGTERM, exit code 0"
  "$engine" rm "$name" >/dev/null
  trap - EXIT INT TERM
  echo "container: smoke test of $image passed"
}

case "$what" in
  build) build ;;
  smoke) smoke ;;
  all) build && smoke ;;
esac
