// runlog.h: what a training run shows and keeps: a progress line on the
// terminal, metrics as JSON lines (metrics.jsonl) and a table for plotting
// (loss.tsv) in the run folder, and a loss-curve PNG drawn by gnuplot.
//
// Every record is one write() of a whole line to a file opened O_APPEND, so a
// process killed at any moment leaves whole lines (run_dir_trim_logs cuts a
// resumed run's logs back to its checkpoint). Every write is checked: the
// first failure (disk full, ...) is reported once on stderr, later records
// are dropped, and runlog_error() says what happened for the final message.
// Every string put into JSON goes through runlog_json_str.
#ifndef RUNLOG_H
#define RUNLOG_H

#include <stdio.h>

#include "common.h"

typedef struct RunLog {
    int jsonl, tsv;        // metrics.jsonl, loss.tsv (fds; -1 when closed)
    char dir[1024];
    bool tty;              // progress line rewritten in place
    double t_start;        // wall clock at open (s)
    int total_steps;
    int err;               // errno of the first failed write, 0 if none
    char err_file[32];     // which file it was
} RunLog;

double runlog_now(void);       // monotonic seconds
double runlog_cpu_now(void);   // CPU seconds of the whole process (every thread)
// The CPU's model name from /proc/cpuinfo ("unknown CPU" if absent), for benchmark headers.
void runlog_cpu_name(char *buf, size_t n);
// Open the logs in `dir` (which exists); append: keep what is there (a resumed
// run), else start them fresh.
Status runlog_open(RunLog *r, const char *dir, int total_steps, bool append);
void runlog_close(RunLog *r);
// One training step: progress line (step, loss, lr, grad norm, tokens/s, ETA) + a JSON line.
void runlog_train(RunLog *r, int step, double loss, double lr, double grad_norm, double tok_per_s,
                  double eta_s, bool print);
// Validation: loss per token and bits per byte of the text (loss / ln 2 /
// bytes_per_token: 1 for the byte tokenizer).
void runlog_eval(RunLog *r, int step, double val_loss, double bytes_per_token, double extra_kl, double extra_mass);
// Free-form JSON object line, e.g. the run's start and end records.
void runlog_json(RunLog *r, const char *json_object);
// s as a JSON string literal, quotes included, escaped (truncated to fit n).
const char *runlog_json_str(const char *s, char *out, size_t n);
// The first write failure as "metrics.jsonl: No space left on device", or NULL.
const char *runlog_error(const RunLog *r, char *buf, size_t n);

// What loss.png shows. separate: the two series are different quantities
// (e.g. the distillation KL and the LM's validation loss) and get a panel each.
typedef struct RunLogPlot {
    const char *title;
    const char *train_label, *val_label;   // series and axis names
    bool separate;
} RunLogPlot;
// Draw loss.png from loss.tsv with gnuplot, run without a shell on a script
// written to the run folder. Returns false (with a note) if gnuplot is
// missing or fails; a failed plot leaves no loss.png behind.
bool runlog_plot(const RunLog *r, const RunLogPlot *p);
// The plot's title and labels: a loss is per token, which is a byte only
// for the byte tokenizer (bpe: a BPE run); kl: an indexer distillation,
// whose training curve is a KL divergence beside the validation LM loss.
RunLogPlot runlog_plot_labels(const char *title, bool kl, bool bpe);

// A long job's progress on f (stderr): "<what>: 1200 / 5000 tokens (24%),
// 310 tokens/s", at most every `every_s` seconds (*last: when the last line
// went out, 0 at first; t0: when the job started) and once with final set.
// On a terminal the line is rewritten in place, elsewhere (a log) one line each.
void runlog_progress(FILE *f, const char *what, int64_t done, int64_t total, double t0, double *last, double every_s,
                     bool final);

#endif
