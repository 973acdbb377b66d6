// runlog.h: what a training run shows and keeps: a progress line on the
// terminal, metrics as JSON lines (metrics.jsonl) and a table for plotting
// (loss.tsv) in the run folder, and a loss-curve PNG drawn by gnuplot.
#ifndef RUNLOG_H
#define RUNLOG_H

#include <stdio.h>

#include "common.h"

typedef struct RunLog {
    FILE *jsonl;           // metrics.jsonl
    FILE *tsv;             // loss.tsv: step, train loss, val loss (NaN where absent)
    char dir[512];
    bool tty;              // progress line rewritten in place
    double t_start;        // wall clock at open (s)
    int total_steps;
} RunLog;

double runlog_now(void);       // monotonic seconds
double runlog_cpu_now(void);   // CPU seconds of the whole process (every thread)
// The CPU's model name from /proc/cpuinfo ("unknown CPU" if absent), for benchmark headers.
void runlog_cpu_name(char *buf, size_t n);
// append: keep existing files (a resumed run).
Status runlog_open(RunLog *r, const char *dir, int total_steps, bool append);
void runlog_close(RunLog *r);
// One training step: progress line (step, loss, lr, grad norm, tokens/s, ETA) + a JSON line.
void runlog_train(RunLog *r, int step, double loss, double lr, double grad_norm, double tok_per_s,
                  double eta_s, bool print);
// Validation: loss and bits per byte (loss / ln 2 for a byte-level tokenizer).
void runlog_eval(RunLog *r, int step, double val_loss, double extra_kl, double extra_mass);
// Free-form JSON object line, e.g. the run's start and end records.
void runlog_json(RunLog *r, const char *json_object);
// Draw loss.png from loss.tsv with gnuplot; returns false (with a note) if gnuplot is missing.
bool runlog_plot(const RunLog *r, const char *title);

#endif
