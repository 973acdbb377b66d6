#!/usr/bin/env bash
# The default corpus: the King James Bible from Debian's bible-kjv package,
# as plain text (verse references removed), one verse per line and a blank
# line between books (the bundled configs' documents: [data] documents =
# blank_line), in cache/kjv.txt. Nothing of it is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=cache/kjv.txt
# Kept when it is there and has its books apart (a file from before the
# blank lines is made again).
[ -s "$out" ] && grep -q '^$' "$out" && exit 0
command -v bible >/dev/null || { echo "get_corpus: 'bible' not found: apt-get install bible-kjv" >&2; exit 1; }
mkdir -p cache
# Each line starts with its reference (Ge1:1, 1Sa3:4, ...): a new book name starts a document.
bible -f gen1:1-rev22:21 | awk '
    match($0, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /) {
        ref = substr($0, 1, RLENGTH - 1); book = ref; sub(/[0-9]+:[0-9]+$/, "", book)
        if (NR > 1 && book != last) print ""
        last = book
        print substr($0, RLENGTH + 1)
        next
    }
    { print }' > "$out.tmp"
mv "$out.tmp" "$out"
echo "get_corpus: $(wc -c < "$out") bytes in $out ($(grep -c '^$' "$out") blank lines between books)"
