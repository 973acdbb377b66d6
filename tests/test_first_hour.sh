#!/usr/bin/env bash
# tests/test_first_hour.sh BUILD_DIR: the README's "## Your first hour"
# commands, run exactly as written and in order, in a fresh clone of the
# project (its committed files only) whose bin/ links BUILD_DIR's programs, as
# `scripts/run.sh main|build` links them. The corpus is made as the main job
# makes it (scripts/get_corpus.sh; a copy of this checkout's cache/kjv.txt
# when there is one, which is what that script would write).
set -euo pipefail
BUILD=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-first-hour-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
CLONE="$TMP/attnlab"
git clone -q "$ROOT" "$CLONE"
cd "$CLONE"
mkdir -p bin
# The programs scripts/run.sh links into bin/ (its PROGRAMS list).
mapfile -t programs < <(sed -n 's/^PROGRAMS=(\(.*\))$/\1/p' scripts/run.sh | tr ' ' '\n')
[ "${#programs[@]}" -gt 0 ] || { echo "first hour: no PROGRAMS list in scripts/run.sh" >&2; exit 1; }
for p in "${programs[@]}"; do ln -s "$BUILD/$p" "bin/$p"; done
if [ -s "$ROOT/cache/kjv.txt" ] && grep -q '^$' "$ROOT/cache/kjv.txt"; then
    mkdir -p cache
    cp "$ROOT/cache/kjv.txt" cache/kjv.txt
else
    scripts/get_corpus.sh >/dev/null
fi
# The first fenced block after the heading, without its fence lines.
block=$(awk '/^## Your first hour/ {in_sec = 1; next}
             in_sec && /^## / {exit}
             in_sec && /^```/ {if (in_block) exit; in_block = 1; next}
             in_block {print}' README.md)
[ -n "$block" ] || { echo "first hour: no fenced block under '## Your first hour' in README.md" >&2; exit 1; }
n=0
while IFS= read -r line; do
    [ -n "${line// /}" ] || continue
    n=$((n + 1))
    echo "first hour: \$ $line" >&2
    # The README's own line, as a user pastes it into a shell.
    if ! bash -euo pipefail -c "$line" >"$TMP/out.txt" 2>"$TMP/err.txt"; then
        echo "first hour: command $n failed: $line" >&2
        tail -20 "$TMP/err.txt" >&2
        exit 1
    fi
done <<<"$block"
echo "first hour: the README's $n first-hour commands ran as written in a fresh clone: OK"
