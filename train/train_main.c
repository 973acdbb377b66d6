// train: train a small hybrid language model from an INI config.
//
//   train --config tiny_gdn.ini [--set section.key=value ...] [--resume | --overwrite]
//   train --config tiny_gdn.ini --dump-state state.h5
//   mpirun -np 4 train --config tiny_gdn.ini   # data parallel (README "Many processes (MPI)")
//   train --help
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "version.h"
#include "dist.h"
#include "dump_state.h"
#include "fileio.h"
#include "trainer.h"
#include "model_setup.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: train --config FILE [--set section.key=value ...] [--resume | --overwrite] [--dump-state FILE]\n"
            "             [--device cpu|cuda]\n"
            "\n"
            "  --config FILE        an INI file; a bare name such as tiny_gdn.ini is looked up in configs/\n"
            "  --set S.K=V          override one key after the file (repeatable)\n"
            "  --resume             continue the run in <run_dir> from its checkpoint.h5, bit for bit as if\n"
            "                       never stopped; the run keeps its stored config (only resumable keys such\n"
            "                       as train.steps may be changed with --set)\n"
            "  --overwrite          start afresh in a run_dir that holds a previous run (deletes its\n"
            "                       checkpoint and logs); without it such a run_dir is refused\n"
            "  --dump-state FILE    one forward and backward on the first training batch; write tokens,\n"
            "                       targets, logits, loss, every parameter and gradient to FILE (HDF5)\n"
            "  --device cpu|cuda    where the step runs: the same as --set train.device=cpu|cuda (stored in\n"
            "                       the run's config; cuda needs a build with AG_CUDA, see docs/cuda.md)\n"
            "  --help               this text and every config key\n"
            "\n"
            "Ctrl-C (or SIGTERM) saves a checkpoint and exits; --resume continues from it. A second Ctrl-C,\n"
            "a second or more after the first, exits at once without saving.\n"
            "Under mpirun (mpirun -np N train ...) the ranks share every batch and average their gradients;\n"
            "rank 0 writes the checkpoints and logs.\n\n");
    config_help(f);
}

// 0: parsed; 1: --help shown (by rank 0); 2: bad arguments (*why says what).
static int parse_args(int argc, char **argv, TrainerOptions *o, const char **sets, const char **dump_path,
                      Status *why) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (dist_rank() == 0) usage(stdout);
            return 1;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            o->config = argv[++i];
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            sets[o->n_sets++] = argv[++i];
        } else if (!strcmp(argv[i], "--resume")) {
            o->resume = true;
        } else if (!strcmp(argv[i], "--overwrite")) {
            o->overwrite = true;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
                *why = status_err("--device '%.40s': expected cpu or cuda", d);
                return 2;
            }
            sets[o->n_sets++] = strcmp(d, "cuda") ? "train.device=cpu" : "train.device=cuda";
        } else if (!strcmp(argv[i], "--dump-state") && i + 1 < argc) {
            *dump_path = argv[++i];
        } else {
            *why = status_err("unknown or incomplete argument '%.200s' (see train --help)", argv[i]);
            return 2;
        }
    }
    if (!o->config) {
        *why = status_err("--config FILE is required (see train --help)");
        return 2;
    }
    if (o->resume && o->overwrite) {
        *why = status_err("--resume continues the run in run_dir, --overwrite replaces it: give one");
        return 2;
    }
    return 0;
}

static int run(int argc, char **argv) {
    TrainerOptions o = {0};
    const char *dump_path = NULL;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    Status why = status_ok();
    int code = parse_args(argc, argv, &o, sets, &dump_path, &why);
    o.sets = sets;
    // Under an MPMD launch each rank has arguments of its own: one rank's bad
    // ones stop all (rank 0 tells its own, the others theirs prefixed).
    if (code != 1) why = dist_agree(why, "train");
    if (!why.ok && dist_rank() == 0) fprintf(stderr, "train: %s\n", why.msg);
    if (code || !why.ok) {
        free(sets);
        return code == 1 ? 0 : 2;
    }
    static Trainer t;
    Status s = trainer_setup(&t, &o);
    if (!s.ok) {
        if (dist_rank() == 0) fprintf(stderr, "train: %s\n", s.msg);   // (other ranks printed their own)
        free(sets);
        return 2;
    }
    if (dump_path && t.cfg.train.device != DEVICE_CPU) {
        fprintf(stderr, "train: --dump-state runs on the CPU: add --device cpu\n");
        code = 2;
    } else if (dump_path) {   // rank 0 alone, on the whole first batch
        code = 0;
        if (t.rank == 0) {
            batcher_set_share(&t.bt, 0, t.cfg.data.batch_size);
            // The batch and loss of the run's first step: its document flags and carried states too.
            int *doc = batcher_has_flags(&t.bt) ? t.doc : NULL;
            batcher_train(&t.bt, t.x, t.y, doc);
            DumpBatch b = {t.x, t.y, doc, t.cfg.data.batch_size, t.cfg.data.seq_len, t.carry,
                           t.cfg.finetune.mode == FT_INDEXER};
            s = dump_state_write(dump_path, &t.tp, &t.lm, &t.ps, &b);
            if (s.ok) printf("train: wrote the state of one forward and backward to %s\n", dump_path);
            else fprintf(stderr, "train: --dump-state: %s\n", s.msg);
            code = s.ok ? 0 : 1;
        }
        dist_barrier("--dump-state");
    } else {
        code = trainer_run(&t, &o);
    }
    trainer_free(&t);
    free(sets);
    return code;
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "train")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it (may re-execute: before MPI)
    file_check_stdout_at_exit("train");
    dist_init(&argc, &argv);    // MPI only when mpirun started this process
    int code = run(argc, argv);
    if (code == 130 && dist_size() > 1) {
        if (trainer_stop_ends_job()) {
            // SIGINT or SIGTERM: mpirun is ending the job (Ctrl-C or SIGTERM reach it first). The
            // checkpoint is saved; leave now, as MPI_Finalize would wait for a job being torn down.
            fflush(NULL);
            _exit(code);
        }
        // SIGUSR1 (mpirun forwards it and keeps the job): a stop asked for, with its checkpoint saved.
        // Every rank finalizes and exits 0, as mpirun reads any other status as a failed job and prints
        // its "job aborted" banner; rank 0's "interrupted: checkpoint at step ..." line says what happened.
        code = 0;
    }
    dist_finalize();
    return code;
}
