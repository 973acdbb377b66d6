#include "runlog.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double runlog_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static Status mkdirs(const char *path) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return status_err("cannot create '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return status_err("cannot create '%s': %s", buf, strerror(errno));
    return status_ok();
}

double runlog_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void runlog_cpu_name(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *c = strchr(line, ':');
        if (c) {
            snprintf(buf, n, "%s", c + 2);
            buf[strcspn(buf, "\n")] = 0;
        }
        break;
    }
    fclose(f);
}

Status runlog_open(RunLog *r, const char *dir, int total_steps, bool append) {
    memset(r, 0, sizeof *r);
    Status s = mkdirs(dir);
    if (!s.ok) return s;
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    r->jsonl = fopen(path, append ? "a" : "w");
    if (!r->jsonl) return status_err("cannot write '%s': %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/loss.tsv", dir);
    r->tsv = fopen(path, append ? "a" : "w");
    if (!r->tsv) return status_err("cannot write '%s': %s", path, strerror(errno));
    if (!append) fprintf(r->tsv, "# step\ttrain_loss\tval_loss\n");
    r->tty = isatty(fileno(stderr));
    r->t_start = runlog_now();
    r->total_steps = total_steps;
    return status_ok();
}

void runlog_close(RunLog *r) {
    if (r->tty) fputc('\n', stderr);
    if (r->jsonl) fclose(r->jsonl);
    if (r->tsv) fclose(r->tsv);
    r->jsonl = r->tsv = NULL;
}

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "--");
        return;
    }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%dh%02dm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%dm%02ds", t / 60, t % 60);
}

void runlog_train(RunLog *r, int step, double loss, double lr, double grad_norm, double tok_per_s,
                  double eta_s, bool print) {
    fprintf(r->jsonl,
            "{\"type\":\"train\",\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.5f,\"tok_per_s\":%.1f,"
            "\"elapsed_s\":%.2f}\n",
            step, loss, lr, grad_norm, tok_per_s, runlog_now() - r->t_start);
    fprintf(r->tsv, "%d\t%.6f\tNaN\n", step, loss);
    if (!print) return;
    char eta[32];
    fmt_eta(eta_s, eta, sizeof eta);
    fprintf(stderr, "%sstep %6d/%d | loss %.4f | lr %.2e | gnorm %6.3f | %8.0f tok/s | ETA %s%s",
            r->tty ? "\r" : "", step, r->total_steps, loss, lr, grad_norm, tok_per_s, eta, r->tty ? "   " : "\n");
    fflush(stderr);
    fflush(r->jsonl);
    fflush(r->tsv);
}

void runlog_eval(RunLog *r, int step, double val_loss, double extra_kl, double extra_mass) {
    double bpb = val_loss / log(2.0);
    fprintf(r->jsonl, "{\"type\":\"eval\",\"step\":%d,\"val_loss\":%.6f,\"val_bpb\":%.6f", step, val_loss, bpb);
    if (!isnan(extra_kl)) fprintf(r->jsonl, ",\"kl\":%.6f", extra_kl);
    if (!isnan(extra_mass)) fprintf(r->jsonl, ",\"topk_mass\":%.6f", extra_mass);
    fprintf(r->jsonl, "}\n");
    fprintf(r->tsv, "%d\tNaN\t%.6f\n", step, val_loss);
    fprintf(stderr, "%sstep %6d | val loss %.4f | val bits/byte %.4f\n", r->tty ? "\n" : "", step, val_loss, bpb);
    fflush(r->jsonl);
    fflush(r->tsv);
}

void runlog_json(RunLog *r, const char *json_object) {
    fprintf(r->jsonl, "%s\n", json_object);
    fflush(r->jsonl);
}

bool runlog_plot(const RunLog *r, const char *title) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: gnuplot not found, no loss plot (apt-get install gnuplot-nox)\n");
        return false;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal pngcairo size 900,540 noenhanced; set output '%s/loss.png'; "
             "set title '%s'; set xlabel 'step'; set ylabel 'loss (nats/byte)'; set grid; set key top right; "
             "set datafile missing 'NaN'; "
             "plot '%s/loss.tsv' using 1:2 with lines lw 1 lc rgb '#4477aa' title 'train', "
             "'' using 1:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#cc3311' title 'validation'\" 2>/dev/null",
             r->dir, title, r->dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd,   // gnuplot-nox may lack cairo: fall back to the png terminal
                 "gnuplot -e \"set terminal png size 900,540; set output '%s/loss.png'; set title '%s' noenhanced; "
                 "set xlabel 'step'; set ylabel 'loss (nats/byte)'; set grid; set datafile missing 'NaN'; "
                 "plot '%s/loss.tsv' using 1:2 with lines title 'train', '' using 1:3 with linespoints pt 7 "
                 "title 'validation'\"",
                 r->dir, title, r->dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "note: gnuplot failed, no loss plot\n");
            return false;
        }
    }
    return true;
}
