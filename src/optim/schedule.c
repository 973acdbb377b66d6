// schedule.c: cosine learning-rate schedule with linear warm-up.
#include "optim.h"

#include <math.h>

double lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (step >= total || total <= warmup) return min_lr;
    double p = (double)(step - warmup) / (double)(total - warmup);
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
