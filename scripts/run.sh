#!/usr/bin/env bash
# scripts/run.sh: the project's entry point on a fresh Debian 12 machine.
#
#   scripts/run.sh main   install packages, build (float32), train the default
#                         model on the default corpus, then sample from it
#   scripts/run.sh test   install packages, build float32, float64 and
#                         ASan+UBSan (float64 and float32), run every test in each (and,
#                         in float32, training under mpirun: tests/mpi_tests.c)
#   scripts/run.sh build  build float32 into build/ only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc)

# libdnnl-dev: oneDNN, the second product backend and the bf16 products (optional
# for a build by hand: without it every product runs on OpenBLAS).
PACKAGES=(build-essential cmake pkg-config libopenblas-openmp-dev libdnnl-dev libhdf5-dev libcriterion-dev
          libinih-dev libpcre2-dev zlib1g-dev gnuplot-nox bible-kjv libopenmpi-dev openmpi-bin)
# The test command also builds the libFuzzer targets (clang) for a short smoke
# run, and checks the PyTorch loader of checkpoints (python3-torch, python3-h5py) and
# its BPE encoding (python3-regex: the split patterns' \p{L} classes).
# strace: the check that scripts/pack_ompi.sh's copy of Open MPI runs on its own.
TEST_PACKAGES=(clang libclang-rt-14-dev libomp-14-dev python3-torch python3-h5py python3-regex strace)
# The user programs, linked into bin/ after `scripts/run.sh main|build` (longctx: the
# synthetic long-context tasks, passkey and MQAR, at growing lengths).
PROGRAMS=(train generate evaluate export_model tokenize longctx)

install_packages() {  # install_packages [extra packages...]
    local missing=()
    for p in "${PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        echo "== installing: ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# OpenMP threads share OpenBLAS's pool (the openmp build of OpenBLAS); idle
# OpenMP threads sleep instead of spinning, so they do not fight BLAS for cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

build() {  # build DIR [cmake options...]
    local dir=$1
    shift
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
    cmake --build "$dir" -j "$JOBS" >/dev/null
}

link_programs() {  # bin/train -> build/train, ...: the README's commands work from the project folder
    mkdir -p "$ROOT/bin"
    for p in "${PROGRAMS[@]}"; do ln -sf "../build/$p" "$ROOT/bin/$p"; done
}

at() {  # at: seconds since the test command started, for the phase lines
    echo "$(( $(date +%s) - start )) s"
}

run_tests() {  # run_tests DIR LABEL
    local dir=$1 label=$2 log
    echo "== tests: $label (at $(at))"
    log="$dir/unit_tests.log"
    # LeakSanitizer's verdict on the unit tests is taken from the log below, not
    # from the exit code (exitcode=0), so a leak in Criterion's own runner does
    # not fail the run; leak_cycles keeps LeakSanitizer's exit code.
    # A TMPDIR of their own: the tests must leave nothing behind in it.
    local tmp
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-run-XXXXXX")
    if ! (cd "$dir" && TMPDIR=$tmp LSAN_OPTIONS=exitcode=0 ./unit_tests --jobs "$JOBS") 2>&1 | tee "$log"; then
        echo "== FAILED: unit tests ($label)"   # (inside `if`, set -e leaves this to us; pipefail gives the status)
        exit 1
    fi
    if [ -n "$(ls -A "$tmp")" ]; then
        echo "== FAILED: the $label tests left files in their TMPDIR: $(ls -A "$tmp" | head -5 | tr '\n' ' ')"
        exit 1
    fi
    rmdir "$tmp"
    # A sanitizer report inside a test's process does not change Criterion's
    # verdict: catch it here. A leak counts when its stack reaches the
    # project's own code (Criterion's runner leaks 48 bytes of its own, which
    # LeakSanitizer reports at its exit).
    if grep -aqE "ERROR: AddressSanitizer|runtime error:" "$log" ||
        awk -v root="$ROOT" '/ERROR: LeakSanitizer/ {inleak = 1} inleak && index($0, root "/") {found = 1}
                             /^SUMMARY: AddressSanitizer/ {inleak = 0} END {exit !found}' "$log"; then
        echo "== FAILED: sanitizer report in the $label tests (see $log)"
        exit 1
    fi
    (cd "$dir" && ./leak_cycles 100)
}

case "${1:-}" in
main)
    install_packages
    build build
    link_programs
    "$ROOT/scripts/main_job.sh"
    ;;
test)
    # npm fetches the pinned llama.cpp build the GGUF test runs (tests/test_llama.sh);
    # Debian's npm only where no npm is installed already.
    command -v npm >/dev/null || TEST_PACKAGES+=(npm)
    install_packages "${TEST_PACKAGES[@]}"
    start=$(date +%s)
    build build-f32
    build build-f64 -DAG_DOUBLE=ON
    build build-asan -DAG_DOUBLE=ON -DAG_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
    # float32 under the sanitizers too: its own code (oneDNN's products, bf16,
    # the float32 exp, the vectorised kernels) is not in the float64 build.
    build build-asan-f32 -DAG_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
    echo "== built float32, float64 and both under the sanitizers (at $(at))"
    run_tests build-f32 float32
    echo "== tests: training under mpirun (float32) (at $(at))"
    (cd build-f32 && ./mpi_tests --jobs 1) || { echo "== FAILED: mpi_tests (float32)"; exit 1; }
    run_tests build-f64 float64
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_tests build-asan "float64 + ASan/UBSan/LSan"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_tests build-asan-f32 "float32 + ASan/UBSan/LSan"
    echo "== from outside: install, examples, export, the PyTorch loader, the Python and bench tools (at $(at))"
    for dir in build-f32 build-f64; do
        tests/test_outside.sh "$dir" || { echo "== FAILED: tests/test_outside.sh $dir"; exit 1; }
    done
    tests/test_tools.sh || { echo "== FAILED: tests/test_tools.sh"; exit 1; }
    echo "== Open MPI copied for a machine without MPI: two ranks from scripts/pack_ompi.sh's copy (at $(at))"
    tests/test_pack_ompi.sh build-f32 || { echo "== FAILED: tests/test_pack_ompi.sh"; exit 1; }
    echo "== llama.cpp runs the exported GGUF models (the npm package @node-llama-cpp/linux-x64) (at $(at))"
    tests/test_llama.sh build-f32 || { echo "== FAILED: tests/test_llama.sh"; exit 1; }
    echo "== the README's first hour, as written, in a fresh clone (at $(at))"
    tests/test_first_hour.sh build-f32 || { echo "== FAILED: tests/test_first_hour.sh"; exit 1; }
    echo "== fuzz smoke (each target on its seed corpus) (at $(at))"
    tests/fuzz/run.sh 8 || { echo "== FAILED: fuzzing"; exit 1; }
    # The CUDA backend (docs/cuda.md) is compiled wherever nvcc is, in both
    # precisions, so it keeps compiling; its tests (cuda_tests) need a GPU.
    if nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null); then
        echo "== CUDA backend: compile only ($nvcc_path) (at $(at))"
        # The library with every kernel, the GPU tests and the programs that
        # take --device cuda (float32); the float64 kernels through cuda_tests.
        for prec in OFF ON; do
            dir=build-cuda targets=(cuda_tests train train_bench generate gpu_ceiling gdn_gpu_bench)
            if [ $prec = ON ]; then dir=build-cuda-f64 targets=(cuda_tests); fi   # (an `&&` list's status would stop set -e)
            cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DAG_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc_path" \
                -DAG_DOUBLE=$prec -DAG_ONEDNN=OFF -DAG_MPI=OFF -DAG_NATIVE=OFF >/dev/null &&
                cmake --build "$dir" -j "$JOBS" --target "${targets[@]}" >/dev/null ||
                { echo "== FAILED: the CUDA build ($dir)"; exit 1; }
        done
    else
        echo "== CUDA backend: skipped (no nvcc on this machine)"
    fi
    echo "== all test builds passed in $(( $(date +%s) - start )) s"
    ;;
build)
    install_packages
    build build
    link_programs
    ;;
*)
    echo "usage: scripts/run.sh main|test|build" >&2
    exit 2
    ;;
esac
