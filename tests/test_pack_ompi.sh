#!/usr/bin/env bash
# tests/test_pack_ompi.sh BUILD_DIR: scripts/pack_ompi.sh's copy of Open MPI runs two ranks of
# BUILD_DIR/dist_bench (an MPI build) on its own: with its ompi_env.sh, every Open MPI library,
# component and help file that mpirun and the ranks open comes from the copy (strace), none from
# /usr. (PMIx's components are looked for only where Debian installed them: that folder is left out
# of the check; ompi_env.sh links it to the copy where a machine has none.)
set -euo pipefail
BUILD=${1:?usage: tests/test_pack_ompi.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "$BUILD")/dist_bench
[ -x "$BIN" ] || { echo "test_pack_ompi: $BIN not built" >&2; exit 1; }
command -v strace >/dev/null || { echo "test_pack_ompi: strace not found" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-ompi-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
"$ROOT/scripts/pack_ompi.sh" "$TMP/ompi" >/dev/null
cat "$ROOT"/docs/*.md >"$TMP/corpus.txt"   # (a few hundred KB of text)
sed -e "s|^corpus = .*|corpus = $TMP/corpus.txt|" -e "s|^cache_dir = .*|cache_dir = $TMP/cache|" \
    "$ROOT/configs/tiny_gdn.ini" >"$TMP/tiny.ini"
cfg=$TMP/tiny.ini
(
    source "$TMP/ompi/ompi_env.sh"
    cd "$TMP"
    OMP_NUM_THREADS=1 strace -f -qq -z -e trace=openat,execve -o "$TMP/trace" \
        mpirun -np 2 "$BIN" --config "$cfg" --steps 3 --reps 1 >"$TMP/out" 2>&1 ||
        { echo "test_pack_ompi: two ranks from the copy failed:"; tail -20 "$TMP/out"; exit 1; }
)
grep -q "ranks=2" "$TMP/out" || { echo "test_pack_ompi: no RESULT line of 2 ranks:"; tail -5 "$TMP/out"; exit 1; }
M="(/usr)?/lib/x86_64-linux-gnu"   # (/lib is /usr/lib: the loader names either)
grep -q "openat(.*$TMP/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/" "$TMP/trace" ||
    { echo "test_pack_ompi: the trace shows no component opened from the copy"; exit 1; }
sys="\"($M/openmpi|/usr/share/openmpi|$M/lib(mpi|open-pal|open-rte|mca_common)|/usr/bin/(orte|mpi))[^\"]*\""
used=$(grep -oE "$sys" "$TMP/trace" | sort -u | head -5 || true)
[ -z "$used" ] || { echo "test_pack_ompi: the copy still opened the system's Open MPI: $used"; exit 1; }
echo "test_pack_ompi: two ranks from scripts/pack_ompi.sh's copy, nothing of the system's Open MPI opened: OK"
