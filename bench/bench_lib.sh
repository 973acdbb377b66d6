# bench/bench_lib.sh: what the benchmark scripts share (sourced, not run).

# width_sets D -> the --set arguments of the bench-only width variants of the
# bundled configs: 128 = the configs as they are; 256: H 4, d_k = d_v = 64,
# d_ff 704; 512: H 8, d_k = d_v = 64, d_ff 1408.
width_sets() {
    case $1 in
        128) ;;
        256) echo "--set model.d_model=256 --set model.n_heads=4 --set model.d_k=64 --set model.d_v=64 --set model.d_ff=704" ;;
        512) echo "--set model.d_model=512 --set model.n_heads=8 --set model.d_k=64 --set model.d_v=64 --set model.d_ff=1408" ;;
        *) echo "bench: width $1 is not one of 128, 256, 512" >&2; exit 2 ;;
    esac
}

# length_sets T -> the --set arguments of T and B = 4096 / T (4096 tokens a step).
length_sets() {
    [ $((4096 % $1)) -eq 0 ] || { echo "bench: T = $1 does not divide 4096" >&2; exit 2; }
    echo "--set data.seq_len=$1 --set data.batch_size=$((4096 / $1))"
}

# field NAME TEXT -> the value of NAME=... on each RESULT line of TEXT.
field() {
    sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"
}

# one_step_checkpoint WHO TRAIN CONFIG DIR -> DIR/checkpoint.h5: CONFIG trained
# for one step by the train program TRAIN (the decoding benchmarks: speed does
# not depend on the weights); WHO names the caller in the error.
one_step_checkpoint() {
    "$2" --config "$3" --set train.steps=1 --set train.eval_every=0 --set "train.run_dir=$4" >/dev/null 2>&1 ||
        { echo "$1: training $(basename "$3" .ini) failed" >&2; exit 1; }
}

# bench_out NAME ARGS... -> OUT (tables, data) and IMG (figures) from leading
# `--out DIR` and `--img DIR` options; the arguments after them in REST.
# Committed results are replaced only when asked: without --out a script
# writes under $BUILD/bench/NAME (BUILD: the build folder), never into docs/.
# --img defaults to the --out folder. The scripts run from the repository
# root, so a relative folder is read from there.
bench_out() {
    bench_opts "$@"
    bench_dirs "$1"
}

# bench_opts NAME ARGS... -> OUT, IMG, PAGE as given by leading --out, --img
# and --page options (empty when not given), the rest in REST. For a script
# that learns its build folder from the arguments after the options: it sets
# BUILD, then calls bench_dirs.
bench_opts() {
    local name=$1
    shift
    OUT="" IMG="" PAGE=""
    while [ $# -gt 0 ]; do
        case $1 in
            --out) [ $# -ge 2 ] || { echo "$name: --out needs a folder" >&2; exit 2; }; OUT=$2; shift 2 ;;
            --img) [ $# -ge 2 ] || { echo "$name: --img needs a folder" >&2; exit 2; }; IMG=$2; shift 2 ;;
            --page) [ $# -ge 2 ] || { echo "$name: --page needs a file" >&2; exit 2; }; PAGE=$2; shift 2 ;;
            *) break ;;
        esac
    done
    REST=("$@")
}

# bench_dirs NAME [PAGE_NAME] -> OUT and IMG made absolute folders that exist
# (OUT default $BUILD/bench/NAME, IMG default OUT). A script that writes a
# Markdown page names it PAGE_NAME: PAGE (--page FILE) defaults to
# OUT/PAGE_NAME and becomes an absolute path; the other scripts refuse --page.
bench_dirs() {
    local name=$1 page_name=${2:-}
    OUT=${OUT:-${BUILD:?}/bench/$name}
    IMG=${IMG:-$OUT}
    mkdir -p "$OUT" "$IMG"
    OUT=$(cd "$OUT" && pwd)
    IMG=$(cd "$IMG" && pwd)
    if [ -z "$page_name" ]; then
        [ -z "$PAGE" ] || { echo "$name: --page $PAGE: this script writes no page" >&2; exit 2; }
        return 0
    fi
    PAGE=${PAGE:-$OUT/$page_name}
    case $PAGE in */) echo "$name: --page $PAGE: names a folder, not a file" >&2; exit 2 ;; esac
    [ "${PAGE%/*}" != "$PAGE" ] || PAGE=./$PAGE
    local dir=${PAGE%/*}
    dir=${dir:-/}
    mkdir -p "$dir"
    PAGE=$(cd "$dir" && pwd)/${PAGE##*/}
    PAGE=${PAGE#/}
    PAGE=/$PAGE
}

# mixer_colour NAME -> the colour of a mixer's lines, the same in every plot.
# A "_long" suffix (a task's longer runs) keeps the mixer's colour; a name not
# listed is grey.
mixer_colour() {
    case ${1%_long} in
        attn) echo "#000000" ;;
        linear) echo "#1f77b4" ;;
        mamba) echo "#2ca02c" ;;
        mamba2) echo "#17becf" ;;
        gdn) echo "#d62728" ;;
        gdp) echo "#ff7f0e" ;;
        gdp_nh3) echo "#8c564b" ;;
        kda) echo "#e377c2" ;;
        hybrid) echo "#9467bd" ;;
        attn_dsa) echo "#bcbd22" ;;
        *) echo "#7f7f7f" ;;
    esac
}

# gnuplot_colours NAME... -> a gnuplot function colour(s) of a series s
# ("mixer" or "mixer:form") giving mixer_colour of its mixer.
gnuplot_colours() {
    local expr="" m
    for m in "$@"; do expr="${expr}m eq \"$m\" ? \"$(mixer_colour "$m")\" : "; done
    echo "colour_of(m) = ${expr}\"$(mixer_colour "")\""
    echo 'colour(s) = colour_of(mixer(s))'
}

# gpu_program NAME [GIVEN] -> the path of a GPU build's program NAME: GIVEN
# when set (the caller's environment variable, already absolute), else the
# packed .gpu/bin/NAME, else build-cuda/NAME (both under the repository root,
# the current folder), else NAME on PATH; empty when none is executable.
gpu_program() {
    local p=${2:-}
    if [ -z "$p" ]; then
        for t in ".gpu/bin/$1" "build-cuda/$1"; do
            [ -x "$t" ] && { p=$PWD/$t; break; }
        done
    fi
    p=${p:-$(command -v "$1" || true)}
    if [ -n "$p" ] && [ -x "$p" ]; then echo "$p"; fi
}

# packed_libs PROGRAM -> the LD_LIBRARY_PATH to run PROGRAM with: a packed
# program's lib/ folder (pack.sh's, beside its env.sh) and CUDA's first, then
# the caller's; PyTorch runs without them (it keeps its own libraries).
packed_libs() {
    local dir libs=${LD_LIBRARY_PATH:-}
    dir=$(dirname "$1")/..
    if [ -f "$dir/env.sh" ] && [ -d "$dir/lib" ]; then
        libs="$(cd "$dir/lib" && pwd):/usr/local/cuda/lib64${libs:+:$libs}"
    fi
    echo "$libs"
}
