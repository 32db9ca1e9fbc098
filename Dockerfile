# attend-server and the attend CLI on Debian bookworm.
#
#   bash scripts/container.sh          # builds attend:dev and smoke-tests it (docker or podman)
#
# Two stages: the build stage has the compilers and -dev packages; the runtime stage gets only
# the two binaries and the shared libraries they load, and runs them as a non-root user.
# Build with `--format docker` under podman: the OCI image format has no HEALTHCHECK.

FROM debian:bookworm-slim AS build

# Parallel compile jobs; the machines this is built on have 2 cores.
ARG ATTEND_JOBS=2

# scripts/setup.sh's build packages, without the test, benchmark and Python ones: the image
# builds with ATTEND_BUILD_TESTS/ATTEND_BUILD_BENCH off. oneDNN's CMake config looks for OpenCL,
# which libdnnl-dev only recommends (ocl-icd-opencl-dev).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake g++ make pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto \
      libabsl-dev libdnnl-dev ocl-icd-opencl-dev prometheus-cpp-dev libxxhash-dev \
 && apt-get clean && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only the directories the two targets are built from, so that editing tests, benchmarks or
# docs does not invalidate the compile layer.
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY common common
COPY core core
COPY planner planner
COPY server server
COPY client client
# The commit that --version reports (the build context has no .git); scripts/container.sh passes
# `git rev-parse --short=12 HEAD`.
ARG ATTEND_GIT_COMMIT=unknown
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DATTEND_BUILD_TESTS=OFF -DATTEND_BUILD_BENCH=OFF -DATTEND_GIT_COMMIT="${ATTEND_GIT_COMMIT}" >/dev/null \
 && cmake --build build -j "${ATTEND_JOBS}" --target attend-server attend \
 && strip build/server/attend-server build/client/attend

FROM debian:bookworm-slim

# The repository has no fixed public address yet: scripts/container.sh adds
# org.opencontainers.image.source (the origin remote's URL, when there is one) and .revision
# (the commit) with --label.
LABEL org.opencontainers.image.title="attend" \
      org.opencontainers.image.description="CPU transformer attention (oneDNN), KV caches and capacity planning over gRPC, with Prometheus metrics" \
      org.opencontainers.image.version="0.1.0"

# The packages that own the libraries `ldd` lists for the two binaries (their own dependencies,
# gRPC core, re2, c-ares, civetweb, OpenCL loader, come along). libstdc++6, libgcc-s1, libc6
# and zlib1g are already in the base image. `apt-get clean`: a base image made with debootstrap
# (../shared/tools/container-base.sh) keeps downloaded .debs and apt's caches (~89 MB here),
# which the official slim image's apt configuration would have removed.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libdnnl2 libabsl20220623 libgomp1 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libxxhash0 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*

# A fixed uid outside the system range, so that mounted files and Kubernetes' runAsUser can name it.
RUN useradd --uid 10001 --user-group --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin attend \
 && install -d -o attend -g attend -m 0750 /var/lib/attend/snapshots
# Where --snapshot_dir points in deploy/compose.yaml and the StatefulSet: a volume mounted there
# starts with this directory's owner (Docker and Podman copy it into an empty named volume).

COPY --from=build /src/build/server/attend-server /src/build/client/attend /usr/local/bin/
# Fail the build here, not at start-up, if a runtime library is missing.
RUN if ldd /usr/local/bin/attend-server /usr/local/bin/attend | grep 'not found'; then exit 1; fi

USER attend:attend
# gRPC and Prometheus /metrics; the server's defaults already listen on 0.0.0.0 for both.
EXPOSE 50051 9464
# The in-container CLI (and so the health check) talks to this server; set ATTEND_TARGET too
# when moving the gRPC port with --address / ATTEND_ADDRESS.
ENV ATTEND_TARGET=127.0.0.1:50051
# `attend health` exits 0 only when the server and every attend.v1 service are SERVING (5 when
# one is not, e.g. while draining after SIGTERM; 3 when the server cannot be reached).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["attend", "--deadline", "3", "health"]
# Exec form: attend-server is PID 1 and gets SIGTERM itself, on which it drains (health turns
# NOT_SERVING, in-flight calls get --shutdown_grace, 10s by default) and exits 0. Arguments
# after the image name are appended as server flags; ATTEND_<FLAG> variables work too.
ENTRYPOINT ["attend-server"]
