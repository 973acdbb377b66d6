// bpe_bench: BPE encoding speed (one thread) and training time.
//
//   bpe_bench encode NAME|FILE TEXT [IDS_OUT]   MB/s, median of 5 runs; the ids to IDS_OUT
//   bpe_bench train CORPUS VOCAB[,VOCAB...]      seconds to train each vocabulary size
//
// bench/bpe_bench.sh runs both on the texts it builds, next to the npm
// tiktoken package, and checks that the ids are the same.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpe.h"
#include "bpe_train.h"
#include "corpus.h"
#include "runlog.h"

static void print_machine(void) {
    char line[256], model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            snprintf(model, sizeof model, "%s", p ? p + 2 : line);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    printf("machine: %s, %ld cores online; threads used: 1\n", model, sysconf(_SC_NPROCESSORS_ONLN));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_encode(const char *tok, const char *path, const char *ids_out) {
    Status st;
    double t0 = runlog_now();
    Bpe *b = bpe_open(tok, &st);
    if (!b) {
        fprintf(stderr, "bpe_bench: %s\n", st.msg);
        return 1;
    }
    double t_load = runlog_now() - t0;
    Corpus c;
    st = corpus_load(&c, path);
    if (!st.ok) {
        fprintf(stderr, "bpe_bench: %s\n", st.msg);
        return 1;
    }
    int *ids = xmalloc((size_t)(c.n + 1) * sizeof *ids);
    double secs[5];
    int64_t m = 0;
    for (int r = 0; r < 5; r++) {
        t0 = runlog_now();
        m = bpe_encode(b, c.bytes, c.n, ids, 0);
        secs[r] = runlog_now() - t0;
    }
    qsort(secs, 5, sizeof *secs, cmp_double);
    printf("encode %-12s %s: %lld bytes -> %lld tokens (%.3f bytes/token), %.3f s, %.2f MB/s (median of 5; load %.2f s)\n",
           tok, path, (long long)c.n, (long long)m, (double)c.n / (double)m, secs[2], (double)c.n / secs[2] / 1e6,
           t_load);
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        for (int64_t i = 0; f && i < m; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
        if (f) fputc('\n', f), fclose(f);
    }
    free(ids);
    corpus_free(&c);
    bpe_free(b);
    return 0;
}

static int bench_train(const char *path, const char *vocabs) {
    Corpus c;
    Status st = corpus_load(&c, path);
    if (!st.ok) {
        fprintf(stderr, "bpe_bench: %s\n", st.msg);
        return 1;
    }
    const char *sp[1] = {"<|endoftext|>"};
    for (const char *p = vocabs; *p;) {
        int vocab = atoi(p);
        BpeTrainOpts o = {.vocab = vocab, .specials = sp, .n_specials = 1};
        uint8_t *file;
        size_t len;
        BpeTrainStats s;
        double t0 = runlog_now();
        st = bpe_train(c.bytes, c.n, &o, &file, &len, &s);
        double secs = runlog_now() - t0;
        if (!st.ok) {
            fprintf(stderr, "bpe_bench: %s\n", st.msg);
            return 1;
        }
        printf("train vocab %6d on %s (%.1f MB, %lld pieces, %lld distinct): %.2f s (%d merges)\n", vocab, path,
               (double)c.n / 1e6, (long long)s.pieces, (long long)s.unique_pieces, secs, s.merges);
        fflush(stdout);
        free(file);
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
    }
    corpus_free(&c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "encode") == 0) {
        print_machine();
        return bench_encode(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
    }
    if (argc == 4 && strcmp(argv[1], "train") == 0) {
        print_machine();
        return bench_train(argv[2], argv[3]);
    }
    fprintf(stderr, "usage: bpe_bench encode NAME|FILE TEXT [IDS_OUT] | bpe_bench train CORPUS VOCAB[,VOCAB...]\n");
    return 2;
}
