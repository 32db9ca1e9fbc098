# Sourced by scripts/setup.sh, test.sh and fuzz.sh from the repository's root: ccache (which
# CMakeLists.txt puts in front of the compiler when it is installed) shared by every clone of the
# repository on this machine. Paths under the clone are rewritten relative to it (base_dir) and
# the working directory is left out of the hash (hash_dir false), so that a fresh clone in
# another directory hits what an earlier clone compiled; the four configurations (Release, TSan,
# ASan, fuzz) hold about 0.6 GiB of objects.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
