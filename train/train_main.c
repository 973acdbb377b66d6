// train: train a small hybrid language model from an INI config.
//
//   train --config tiny_gdn.ini [--set section.key=value ...] [--resume]
//   train --config tiny_gdn.ini --dump-state state.h5
//   train --help
#include <stdlib.h>
#include <string.h>

#include "dump_state.h"
#include "trainer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: train --config FILE [--set section.key=value ...] [--resume] [--dump-state FILE]\n"
            "\n"
            "  --config FILE        an INI file; a bare name such as tiny_gdn.ini is looked up in configs/\n"
            "  --set S.K=V          override one key after the file (repeatable)\n"
            "  --resume             continue from <run_dir>/checkpoint.h5, bit for bit as if never stopped\n"
            "  --dump-state FILE    one forward and backward on the first training batch; write tokens,\n"
            "                       targets, logits, loss, every parameter and gradient to FILE (HDF5)\n"
            "  --help               this text and every config key\n"
            "\n"
            "Ctrl-C saves a checkpoint and exits; --resume continues from it.\n\nConfig keys:\n");
    config_help(f);
}

int main(int argc, char **argv) {
    TrainerOptions o = {0};
    const char *dump_path = NULL;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            o.config = argv[++i];
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            sets[o.n_sets++] = argv[++i];
        } else if (!strcmp(argv[i], "--resume")) {
            o.resume = true;
        } else if (!strcmp(argv[i], "--dump-state") && i + 1 < argc) {
            dump_path = argv[++i];
        } else {
            fprintf(stderr, "train: unknown or incomplete argument '%s' (see train --help)\n", argv[i]);
            return 2;
        }
    }
    o.sets = sets;
    if (!o.config) {
        fprintf(stderr, "train: --config FILE is required (see train --help)\n");
        return 2;
    }
    static Trainer t;
    Status s = trainer_setup(&t, &o);
    if (!s.ok) {
        fprintf(stderr, "train: %s\n", s.msg);
        return 2;
    }
    int code;
    if (dump_path) {
        batcher_train(&t.bt, t.x, t.y);
        s = dump_state_write(dump_path, &t.tp, &t.lm, &t.ps, t.x, t.y, t.cfg.data.batch_size, t.cfg.data.seq_len);
        if (s.ok) printf("train: wrote the state of one forward and backward to %s\n", dump_path);
        else fprintf(stderr, "train: --dump-state: %s\n", s.msg);
        code = s.ok ? 0 : 1;
    } else {
        code = trainer_run(&t, &o);
    }
    trainer_free(&t);
    free(sets);
    return code;
}
