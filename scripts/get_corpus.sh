#!/usr/bin/env bash
# The default corpus: the King James Bible from Debian's bible-kjv package,
# as plain text (verse references removed), in cache/kjv.txt. Nothing of it
# is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=cache/kjv.txt
[ -s "$out" ] && exit 0
command -v bible >/dev/null || { echo "get_corpus: 'bible' not found: apt-get install bible-kjv" >&2; exit 1; }
mkdir -p cache
bible -f gen1:1-rev22:21 | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$out.tmp"
mv "$out.tmp" "$out"
echo "get_corpus: $(wc -c < "$out") bytes in $out"
