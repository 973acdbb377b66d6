#include "runlog.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fileio.h"

double runlog_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

static int open_log(const char *dir, const char *name, bool append, char *path, size_t n, Status *s) {
    *s = path_join(path, n, dir, name);
    if (!s->ok) return -1;
    // Appended to in place, so not through FileOut; but only a regular file or
    // a new name (fileio.h), and never through a link (O_NOFOLLOW) nor waiting
    // on a FIFO (O_NONBLOCK, then the kind is checked on what was opened).
    *s = file_check_output(path, name);
    if (!s->ok) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (append ? 0 : O_TRUNC),
                  0644);
    if (fd < 0) *s = status_err("cannot write '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        close(fd);
        *s = file_check_output(path, name);   // (what lies there now, in words)
        if (s->ok) *s = status_err("cannot write '%s': not a regular file", path);
        return -1;
    }
    if (fd >= 0) fcntl(fd, F_SETFL, O_APPEND);
    return fd;
}

Status runlog_open(RunLog *r, const char *dir, int total_steps, bool append) {
    memset(r, 0, sizeof *r);
    r->jsonl = r->tsv = -1;
    if (snprintf(r->dir, sizeof r->dir, "%s", dir) >= (int)sizeof r->dir)
        return status_err("run folder path too long: %.100s...", dir);
    char path[1100];
    Status s;
    r->jsonl = open_log(dir, "metrics.jsonl", append, path, sizeof path, &s);
    if (s.ok) r->tsv = open_log(dir, "loss.tsv", append, path, sizeof path, &s);
    if (!s.ok) {
        runlog_close(r);
        return s;
    }
    struct stat sb;
    if (fstat(r->tsv, &sb) == 0 && sb.st_size == 0) {
        const char *hdr = "# step\ttrain_loss\tval_loss\n";
        int e = file_write_all(r->tsv, hdr, strlen(hdr));
        if (e) {
            runlog_close(r);
            return status_err("cannot write '%s': %s", path, strerror(e));
        }
    }
    r->tty = isatty(fileno(stderr));
    r->t_start = runlog_now();
    r->total_steps = total_steps;
    return status_ok();
}

void runlog_close(RunLog *r) {
    if (r->tty && r->jsonl >= 0) fputc('\n', stderr);
    if (r->jsonl >= 0) close(r->jsonl);
    if (r->tsv >= 0) close(r->tsv);
    r->jsonl = r->tsv = -1;
}

// Append one whole line (a record) to fd; after the first failure, nothing more is written.
static void put_line(RunLog *r, int fd, const char *name, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put_line(RunLog *r, int fd, const char *name, const char *fmt, ...) {
    if (r->err || fd < 0) return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;   // a record never exceeds this; keep it one line
    line[n++] = '\n';
    off_t before = lseek(fd, 0, SEEK_END);
    int e = file_write_all(fd, line, (size_t)n);
    if (e) {
        if (before >= 0 && ftruncate(fd, before) != 0) {}   // no partial line left behind (a full disk takes part)
        r->err = e;
        snprintf(r->err_file, sizeof r->err_file, "%s", name);
        fprintf(stderr, "%strain: writing %s/%s failed: %s; no further records are logged (training goes on)\n",
                r->tty ? "\n" : "", r->dir, name, strerror(e));
    }
}

const char *runlog_error(const RunLog *r, char *buf, size_t n) {
    if (!r->err) return NULL;
    snprintf(buf, n, "%s: %s", r->err_file, strerror(r->err));
    return buf;
}

const char *runlog_json_str(const char *s, char *out, size_t n) {
    size_t u = 0;
    if (n < 3) return "\"\"";
    out[u++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c && u + 8 < n; c++) {
        if (*c == '"' || *c == '\\') {
            out[u++] = '\\';
            out[u++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            u += (size_t)snprintf(out + u, n - u, "\\u%04x", *c);
        } else {
            out[u++] = (char)*c;   // UTF-8 passes through; invalid bytes are the reader's concern
        }
    }
    out[u++] = '"';
    out[u] = 0;
    return out;
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
    put_line(r, r->jsonl, "metrics.jsonl",
             "{\"type\":\"train\",\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.5f,\"tok_per_s\":%.1f,"
             "\"elapsed_s\":%.2f}",
             step, loss, lr, grad_norm, tok_per_s, runlog_now() - r->t_start);
    put_line(r, r->tsv, "loss.tsv", "%d\t%.6f\tNaN", step, loss);
    if (!print) return;
    char eta[32];
    fmt_eta(eta_s, eta, sizeof eta);
    fprintf(stderr, "%sstep %6d/%d | loss %.4f | lr %.2e | gnorm %6.3f | %8.0f tok/s | ETA %s%s",
            r->tty ? "\r" : "", step, r->total_steps, loss, lr, grad_norm, tok_per_s, eta, r->tty ? "   " : "\n");
    fflush(stderr);
}

void runlog_eval(RunLog *r, int step, double val_loss, double bytes_per_token, double extra_kl, double extra_mass) {
    double bpb = val_loss / log(2.0) / bytes_per_token;
    char extra[128] = "";
    if (!isnan(extra_kl)) snprintf(extra, sizeof extra, ",\"kl\":%.6f", extra_kl);
    if (!isnan(extra_mass)) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ",\"topk_mass\":%.6f", extra_mass);
    put_line(r, r->jsonl, "metrics.jsonl", "{\"type\":\"eval\",\"step\":%d,\"val_loss\":%.6f,\"val_bpb\":%.6f%s}", step,
             val_loss, bpb, extra);
    put_line(r, r->tsv, "loss.tsv", "%d\tNaN\t%.6f", step, val_loss);
    fprintf(stderr, "%sstep %6d | val loss %.4f | val bits/byte %.4f\n", r->tty ? "\n" : "", step, val_loss, bpb);
}

void runlog_json(RunLog *r, const char *json_object) { put_line(r, r->jsonl, "metrics.jsonl", "%s", json_object); }

// A gnuplot single-quoted string: '' stands for ', and nothing else is special.
static void gp_str(FILE *f, const char *s) {
    fputc('\'', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '\'') fputs("''", f);
        else fputc(*c < 0x20 ? '?' : *c, f);
    }
    fputc('\'', f);
}

// Run `argv` with the working directory `dir`, its standard output to out_fd
// and its errors to /dev/null; returns its exit status (-1: not run).
static int run_in(const char *dir, char *const argv[], int out_fd) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) dup2(null, 2);
        dup2(out_fd, 1);
        if (chdir(dir) != 0) _exit(126);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Does the file end with a PNG's IEND chunk? (gnuplot exits 0 even when its
// output was cut short by a full disk.)
static bool png_complete(const char *path) {
    static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    unsigned char tail[12];
    FILE *f = fopen(path, "rb");
    bool ok = f && fseek(f, -12, SEEK_END) == 0 && fread(tail, 1, 12, f) == 12 && memcmp(tail, iend, 12) == 0;
    if (f) fclose(f);
    return ok;
}

bool runlog_plot(const RunLog *r, const RunLogPlot *p) {
    char script[1100];
    if (!path_join(script, sizeof script, r->dir, "loss.gp").ok) return false;
    FileOut gp;
    Status s = file_out_open(&gp, script, "plot script", 0);
    if (!s.ok) {
        fprintf(stderr, "note: %s: no loss plot\n", s.msg);
        return false;
    }
    FILE *f = file_out_stream(&gp);
    // Relative paths: gnuplot runs inside the run folder, so no path is quoted.
    // The PNG goes to its standard output: our temporary for loss.png (FileOut),
    // never a file gnuplot would open by name (through a link planted there).
    fputs("set terminal pngcairo size 900,540 noenhanced\n", f);
    fputs("set grid\nset datafile missing 'NaN'\nset key top right\n", f);
    if (p->separate) {
        fputs("set multiplot layout 2,1 title ", f);
        gp_str(f, p->title);
        fputs("\nset xlabel 'step'\nset ylabel ", f);
        gp_str(f, p->train_label);
        fputs("\nplot 'loss.tsv' using 1:2 with lines lw 1 lc rgb '#4477aa' title ", f);
        gp_str(f, p->train_label);
        fputs("\nset ylabel ", f);
        gp_str(f, p->val_label);
        fputs("\nplot 'loss.tsv' using 1:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#cc3311' title ", f);
        gp_str(f, p->val_label);
        fputs("\nunset multiplot\n", f);
    } else {
        fputs("set title ", f);
        gp_str(f, p->title);
        fputs("\nset xlabel 'step'\nset ylabel ", f);
        gp_str(f, p->train_label);
        fputs("\nplot 'loss.tsv' using 1:2 with lines lw 1 lc rgb '#4477aa' title 'train', "
              "'' using 1:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#cc3311' title 'validation'\n",
              f);
    }
    bool wrote = file_out_commit(&gp).ok;
    char png[1100];
    FileOut o;
    int rc = -1;
    if (wrote && path_join(png, sizeof png, r->dir, "loss.png").ok && file_out_open(&o, png, "loss plot", 0).ok) {
        rc = run_in(r->dir, (char *const[]){"gnuplot", "loss.gp", NULL}, o.fd);
        if (rc == 0 && png_complete(o.tmp) && file_out_commit(&o).ok) return true;
        file_out_abort(&o);
    }
    if (rc == 127) fprintf(stderr, "note: gnuplot not found, no loss plot (apt-get install gnuplot-nox)\n");
    else fprintf(stderr, "note: gnuplot failed (%s), no loss plot\n", wrote ? "see loss.gp" : "script not written");
    return false;
}

RunLogPlot runlog_plot_labels(const char *title, bool kl, bool bpe) {
    if (kl)
        return (RunLogPlot){title, "distillation KL (nats)",
                            bpe ? "validation LM loss (nats/token)" : "validation LM loss (nats/byte)", true};
    return (RunLogPlot){title, bpe ? "loss (nats/token)" : "loss (nats/byte)", "validation", false};
}

void runlog_progress(FILE *f, const char *what, int64_t done, int64_t total, double t0, double *last, double every_s,
                     bool final) {
    double now = runlog_now();
    if (!final && now - (*last ? *last : t0) < every_s) return;
    if (final && !*last) return;   // a job too short to have shown progress says nothing
    *last = now;
    bool tty = isatty(fileno(f));
    fprintf(f, "%s%s: %lld / %lld tokens (%.0f%%), %.0f tokens/s%s", tty ? "\r" : "", what, (long long)done,
            (long long)total, total > 0 ? 100.0 * (double)done / (double)total : 100.0,
            now > t0 ? (double)done / (now - t0) : 0.0, tty && !final ? "" : "\n");
    fflush(f);
}
