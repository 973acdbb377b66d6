# bench/run_all_rows.sh: the section "Rows measured together" of the page
# bench/run_all.sh writes (sourced by it, not run): the rows of
# `run_all.sh rows LIST` (DATA/rows_train.tsv, rows_decode.tsv, rows.txt),
# their tables, and each row's time against gdn's of the same form, all from
# one run, so that they compare with each other whatever the load of the
# day of the full run. Uses DATA, hdr, train_table and decode_table of run_all.sh.

# rel_train NAME FORM COLUMN [BASE] -> "lo-hi": NAME FORM's figure over BASE's
# (default gdn) of the same form and T, the least and the most over the T both
# measured.
rel_train() {
    awk -F'\t' -v m="$1" -v f="$2" -v c="$3" -v b="${4:-gdn}" '
        NR == 1 || $11 != "ok" { next }
        $1 == b && $2 == f { g[$3] = $c }
        $1 == m && $2 == f { x[$3] = $c }
        END { for (t in x) if (t in g) { r = x[t] / g[t]; if (lo == "" || r < lo) lo = r; if (hi == "" || r > hi) hi = r }
              if (lo == "") print "-"; else printf "%.2f-%.2f", lo, hi }' "$DATA/rows_train.tsv"
}

# rel_decode NAME [BASE] -> "lo-hi" of NAME's decoding time over BASE's
# (default gdn) at the same P.
rel_decode() {
    awk -F'\t' -v m="$1" -v b="${2:-gdn}" '
        NR == 1 { next }
        $1 == b { g[$2] = $3 }
        $1 == m { x[$2] = $3 }
        END { for (p in x) if (p in g) { r = x[p] / g[p]; if (lo == "" || r < lo) lo = r; if (hi == "" || r > hi) hi = r }
              if (lo == "") print "-"; else printf "%.2f-%.2f", lo, hi }' "$DATA/rows_decode.tsv"
}

# rel_table: one line per row (train and decode), its time over gdn's.
rel_table() {
    echo "| row | form | training, CPU time | training, wall clock | decoding |"
    echo "| --- | --- | ---: | ---: | ---: |"
    local m f
    while IFS=$'\t' read -r m f; do
        echo "| $m | $f | $(rel_train "$m" "$f" 12) | $(rel_train "$m" "$f" 5) | $([ "$f" = recurrent ] && rel_decode "$m" || echo "") |"
    done < <(awk -F'\t' 'NR > 1 && !seen[$1 FS $2]++ {print $1 "\t" $2}' "$DATA/rows_train.tsv")
}

# outliers: the training cells whose CPU time is over 1.5x their row's median
# over T, as "row form at T = t (r x)", comma-separated; nothing when none.
outliers() {
    awk -F'\t' 'NR > 1 && $11 == "ok" { k = $1 " " $2; if (!(k in n)) order[++m] = k; v[k, ++n[k]] = $12; t[k, n[k]] = $3 }
        END { for (j = 1; j <= m; j++) { k = order[j]; c = n[k]
                  for (i = 1; i <= c; i++) w[i] = v[k, i]
                  for (i = 2; i <= c; i++) for (l = i; l > 1 && w[l - 1] > w[l]; l--) { x = w[l]; w[l] = w[l - 1]; w[l - 1] = x }
                  med = c % 2 ? w[(c + 1) / 2] : (w[c / 2] + w[c / 2 + 1]) / 2
                  for (i = 1; i <= c; i++) if (v[k, i] > 1.5 * med)
                      out = out (out == "" ? "" : ", ") sprintf("%s at T = %s (%.1fx)", k, t[k, i], v[k, i] / med) }
              print out }' "$DATA/rows_train.tsv"
}

# lo_of "lo-hi" -> lo; hi_of -> hi.
lo_of() { echo "${1%-*}"; }
hi_of() { echo "${1#*-}"; }

# spread NAME FORM -> slowest / fastest CPU time per token of a training row over T.
spread() {
    awk -F'\t' -v m="$1" -v f="$2" 'NR > 1 && $1 == m && $2 == f && $11 == "ok" {
        if (lo == "" || $12 + 0 < lo) lo = $12 + 0; if (hi == "" || $12 + 0 > hi) hi = $12 + 0 }
        END {if (lo == "") print "-"; else printf "%.2f", hi / lo}' "$DATA/rows_train.tsv"
}

# dspread_rows NAME -> slowest / fastest decoding time over P.
dspread_rows() {
    awk -F'\t' -v m="$1" 'NR > 1 && $1 == m { if (lo == "" || $3 + 0 < lo) lo = $3 + 0
        if (hi == "" || $3 + 0 > hi) hi = $3 + 0 } END {if (lo == "") print "-"; else printf "%.2f", hi / lo}' \
        "$DATA/rows_decode.tsv"
}

# gdp_lines: what the rows say of gdp against gdn and mamba, when they hold them.
gdp_lines() {
    local g2 g3 mb d2 d3 dm slower
    g2=$(rel_train gdp chunked 12)
    [ "$g2" != - ] || return 0
    g3=$(rel_train gdp_nh3 chunked 12)
    mb=$(rel_train mamba chunked 12)
    d2=$(rel_decode gdp)
    d3=$(rel_decode gdp_nh3)
    dm=$(rel_decode mamba)
    slower=$(awk -v a="$(lo_of "$g2")" -v b="$(lo_of "$d2")" 'BEGIN {print (a > 1 && b > 1) ? "**yes**" : "**no**"}')
    cat <<EOF

**gdp against gdn and mamba.** gdp runs the delta rule n_h times per token
(\`op_gdn\` over a sequence n_h times longer, MODEL.md); its q, gate and
output projections are gdn's, its k, v and beta projections n_h times wider,
so its cost per token should lie near n_h times gdn's, a little under.
Over gdn's time at the same T (CPU time, chunked training step): gdp with
n_h = 2 **$g2**, n_h = 3 $g3; mamba $mb. Decoding one token, over gdn's
at the same P: gdp **$d2**, n_h = 3 $d3; mamba $dm. Slower than gdn in
training and in decoding at every T and P measured: $slower. Like gdn's,
gdp's time per token stays flat in T and P (slowest / fastest: training
$(spread gdp chunked) over T, decoding $(dspread_rows gdp) over P; within
1.3x: $(awk -v a="$(spread gdp chunked)" -v b="$(dspread_rows gdp)" 'BEGIN {print (a <= 1.3 && b <= 1.3) ? "**yes**" : "**no**"}')). What gdp
buys for its time, recall and bits per byte at equal training time, is in
[mqar.md](mqar.md#capacity-at-equal-state-size-32-pairs-width-32-learning-rate-sweep) and
[training.md](training.md#gdp-against-gdn-and-mamba).
EOF
}

# kda_lines: what the rows say of kda against gdn, gdp and mamba, when they hold them.
kda_lines() {
    local k kr kg km d dg dm slower
    k=$(rel_train kda chunked 12)
    [ "$k" != - ] || return 0
    kr=$(rel_train kda recurrent 12)
    kg=$(rel_train kda chunked 12 gdp)
    km=$(rel_train kda chunked 12 mamba)
    d=$(rel_decode kda)
    dg=$(rel_decode kda gdp)
    dm=$(rel_decode kda mamba)
    slower=$(awk -v a="$(lo_of "$k")" -v b="$(lo_of "$d")" 'BEGIN {print (a > 1 && b > 1) ? "**yes**" : "**no**"}')
    cat <<EOF

**kda against gdn, gdp and mamba.** kda is gdn's delta rule with one decay
per key channel instead of one per head ([kda.md](kda.md)): its chunked
form cannot take the decay out of the products of q and k, so it forms them
in sub-blocks of 16 rows, as products of operands scaled by each channel's
decays (one exp per element for a channel that decays fast), where gdn's
are plain products; its recurrent form and decoding do gdn's work and one
exp per key channel; its layer adds a low-rank decay projection and an
output gate (MODEL.md). CPU time of the training step over gdn's at the
same T: kda chunked **$k**, recurrent $kr; over gdp's (n_h = 2) $kg, over
mamba's $km. Decoding one token over gdn's at the same P: **$d** (over
gdp's $dg, over mamba's $dm). Slower than gdn in training and in decoding
at every T and P measured: $slower. kda's time per token over T and P
(slowest / fastest): training $(spread kda chunked), decoding
$(dspread_rows kda). What kda buys for its time is in
[mqar.md](mqar.md#capacity-at-equal-state-size-32-pairs-width-32-learning-rate-sweep),
[long_context.md](long_context.md) and
[training.md](training.md#kda-against-gdn-gdp-and-mamba).
EOF
}

# rows_section: the whole section, or nothing when no rows were measured.
rows_section() {
    [ -s "$DATA/rows_train.tsv" ] && [ -s "$DATA/rows_decode.tsv" ] && [ -s "$DATA/rows.txt" ] || return 0
    local rows end
    rows=$(awk -F'\t' 'NR > 1 && !seen[$1]++ {printf "%s%s", (n++ ? "," : ""), $1}' "$DATA/rows_train.tsv")
    end=$(sed -n 's/^loadavg: \(.*\) (at end).*/\1/p' "$DATA/rows.txt" | tail -1)
    cat <<EOF

## Rows measured together

\`bench/run_all.sh --out docs/bench --img docs/img --page docs/benchmarks.md rows $rows\`
measures only these rows of \`mixer_bench\`, in one run (\`-only\`), so that
they compare with each other; the tables above come from another run, on
another machine and load, and do not. Data:
[\`rows_train.tsv\`](bench/rows_train.tsv), [\`rows_decode.tsv\`](bench/rows_decode.tsv),
raw output [\`rows.txt\`](bench/rows.txt). The layer is the one above
(gdp: n_h = 2; the row gdp_nh3: n_h = 3; kda: its chunked form is
\`src/layers/kda_chunk.c\` and its backward, its recurrent form
\`kda_naive.c\`).

| | |
| --- | --- |
| CPU | $(hdr cpu "$DATA/rows.txt") |
| threads | $(hdr threads "$DATA/rows.txt") |
| date | $(hdr date "$DATA/rows.txt") |
| commit | $(hdr commit "$DATA/rows.txt") |
| load average | start: $(hdr loadavg "$DATA/rows.txt"); end: $end |

With a load above 2 on 2 cores the wall-clock figures carry the load's
noise; the CPU time is the steadier measure, and the ratios below use both.$(o=$(outliers)
[ -z "$o" ] || printf '\n\n%s\n%s' "CPU time over 1.5x its row's median over T, most likely a burst of load (measure the" \
    "cell again with \`mixer_bench -only ROW:FORM -T ...\`): $o.")

### Training step: CPU microseconds per token (all threads)

$(train_table 12 "%.1f" "$DATA/rows_train.tsv")

![CPU time per token, rows measured together](img/rows_train_cpu_per_token.png)

### Training step: microseconds per token (wall clock)

$(train_table 5 "%.1f" "$DATA/rows_train.tsv")

### Memory of one training step: MiB (peak RSS growth)

$(train_table 10 "%.0f" "$DATA/rows_train.tsv")

### Decoding: microseconds per token (B = 1)

$(decode_table "$DATA/rows_decode.tsv")

![decode, rows measured together](img/rows_decode.png)

### Against gdn

Each row's time over gdn's of the same form (the least and the most over
the T, or for decoding the P, measured):

$(rel_table)
$(gdp_lines)
$(kda_lines)
EOF
}
