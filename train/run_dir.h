// run_dir.h: a run's folder: one writer at a time, no silent overwrite of a
// previous run, and logs cut back to the checkpoint when a run resumes.
//
//   RunDir rd;
//   Status s = run_dir_open(&rd, "runs/tiny_gdn", RUN_FRESH, overwrite);   // or RUN_RESUME
//   ... train, write checkpoint.h5 and the logs ...
//   run_dir_close(&rd);                                                  // releases the lock
//
// The lock is an flock on <dir>/.lock held for the life of the run: a second
// `train` on the same folder is refused with the first one's pid, instead of
// both writing checkpoint.h5 and metrics.jsonl. The kernel drops the lock
// when the process dies, so a killed run never leaves the folder locked.
#ifndef RUN_DIR_H
#define RUN_DIR_H

#include "common.h"

#define RUN_DIR_PATH_MAX 1024

typedef struct RunDir {
    char path[RUN_DIR_PATH_MAX];
    int lock_fd;            // -1 when not held
    bool restarted;         // RUN_FRESH found the logs of a run with no checkpoint, and deleted them
} RunDir;

typedef enum { RUN_FRESH, RUN_RESUME } RunDirMode;

// Create the folder (and its parents) and take the lock. RUN_FRESH: a folder
// holding a previous run (checkpoint.h5 or metrics.jsonl) is refused unless
// `overwrite`, which deletes that run's checkpoint and logs; a folder with
// logs but no checkpoint (a run stopped before its first checkpoint, which
// --resume cannot continue) is started afresh and rd->restarted set. Either
// mode removes the temporary files a killed run left (fileio.h's, loss.png.tmp).
Status run_dir_open(RunDir *rd, const char *path, RunDirMode mode, bool overwrite);
void run_dir_close(RunDir *rd);

// <dir>/<name> into out (an error, not a truncated path, when it does not fit).
Status run_dir_file(const RunDir *rd, const char *name, char *out, size_t n);

// A resumed run continues at step `step`: cut metrics.jsonl and loss.tsv back
// to their records of steps <= step, dropping anything after the first
// incomplete line (a run killed mid-write) or later step.
Status run_dir_trim_logs(const RunDir *rd, int64_t step);

// Write `text` to <dir>/<name> whole or not at all (temporary file + rename).
Status run_dir_write_file(const RunDir *rd, const char *name, const char *text);

#endif
