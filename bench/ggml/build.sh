#!/bin/bash
# Builds bench/ggml/ggml_peer.cc against ggml, the tensor library inside llama.cpp, for the side
# by side in bench/compare_peers.py. ggml is not a Debian package. The npm package llama.rn (MIT;
# llama.cpp's sources for React Native, symbols prefixed lm_) carries ggml's CPU backend: version
# 0.12.9 carries llama.cpp build 10256, commit 6c8dcaa. This script takes that version from the
# npm registry, checks its digest, and compiles the CPU backend as llama.cpp's own build does by
# default (-march=native, OpenMP), into the build directory. Nothing of it is kept in this
# repository.
#
#   bash bench/ggml/build.sh [build-dir]      # default: build; writes <build-dir>/bench/ggml_peer
set -euo pipefail

version=0.12.9
# The registry's dist.integrity for that version, as a hex SHA-512.
sha512=b91b13540469d4a9c3903834d05bce188acde9265f32a61525f08e77137d152c86b9f2c2f8069dea815665510ef2f9ad36abbe24196c0867af3f8b091a27c0be

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(realpath -m "${1:-build}")"
work="$build/ggml"
mkdir -p "$work/obj" "$build/bench"
cd "$work"

if ! command -v npm >/dev/null; then
  echo "npm is missing: apt-get install -y npm" >&2
  exit 1
fi
tarball="llama.rn-$version.tgz"
if [ ! -f "$tarball" ]; then
  npm pack --silent "llama.rn@$version" >/dev/null
fi
actual="$(sha512sum "$tarball" | cut -d' ' -f1)"
if [ "$actual" != "$sha512" ]; then
  rm -f "$tarball"
  echo "llama.rn $version: SHA-512 $actual, expected $sha512" >&2
  exit 1
fi
rm -rf package
tar xzf "$tarball" package/cpp
src="$work/package/cpp"

flags=(-O3 -march=native -DNDEBUG -D_GNU_SOURCE -DLM_GGML_USE_CPU -DLM_GGML_USE_OPENMP -fopenmp
       -I"$src" -I"$src/ggml-cpu" -w)
c_sources=(ggml.c ggml-alloc.c ggml-quants.c ggml-cpu/ggml-cpu.c ggml-cpu/quants.c
           ggml-cpu/arch/x86/quants.c)
cxx_sources=(ggml-backend.cpp ggml-backend-reg.cpp ggml-backend-meta.cpp ggml-backend-dl.cpp
             ggml-threading.cpp ggml-cpu/ggml-cpu.cpp ggml-cpu/ops.cpp ggml-cpu/binary-ops.cpp
             ggml-cpu/unary-ops.cpp ggml-cpu/vec.cpp ggml-cpu/repack.cpp ggml-cpu/traits.cpp
             ggml-cpu/arch/x86/repack.cpp ggml-cpu/arch/x86/cpu-feats.cpp)
jobs=$(nproc)
printf '%s\n' "${c_sources[@]}" | xargs -P "$jobs" -I{} sh -c \
  'gcc -std=gnu11 "$@" -c "'"$src"'/{}" -o "obj/$(echo {} | tr / _).o"' _ "${flags[@]}"
printf '%s\n' "${cxx_sources[@]}" | xargs -P "$jobs" -I{} sh -c \
  'g++ -std=c++17 "$@" -c "'"$src"'/{}" -o "obj/$(echo {} | tr / _).o"' _ "${flags[@]}"
g++ -std=c++17 -O2 -fopenmp -I"$src" -o "$build/bench/ggml_peer" "$here/ggml_peer.cc" obj/*.o \
  -lpthread -ldl
echo "built $build/bench/ggml_peer (ggml from llama.rn $version)"
