// test_cuda_graph_config.c: [train] cuda_graph = auto|on|off (docs/cuda.md
// "CUDA graphs"): on where graphs cannot run is a config error naming the
// source, line and key and why; auto turns them off there without an error.
// And lm_graph's micro-batch on a CPU tape (no graph: eager).
#include <criterion/criterion.h>
#include <string.h>

#include "config.h"
#include "lm_graph.h"
#include "test_util.h"

static Status validate_text(TrainConfig *cfg, const char *text) {
    config_defaults(cfg, NULL);
    Status s = config_load_string(cfg, text, "graph.ini");
    cr_assert(s.ok, "%s", s.msg);
    return config_validate(cfg);
}

Test(cuda_graph_config, on_without_a_gpu_device_names_the_line) {
    TrainConfig cfg;
    Status s = validate_text(&cfg, "[model]\nlayers = gdn\n[train]\ncuda_graph = on\n");
    cr_assert_str_eq(s.msg, "graph.ini:4: [train] cuda_graph = on: graphs need device = cuda (auto turns graphs off "
                            "there)");
    config_free(&cfg);
    config_defaults(&cfg, NULL);
    cr_assert(config_set(&cfg, "train.cuda_graph=on").ok);
    s = config_validate(&cfg);
    cr_assert(strstr(s.msg, "--set: [train] cuda_graph = on: graphs need device = cuda"), "%s", s.msg);
    config_free(&cfg);
}

Test(cuda_graph_config, auto_and_off_are_never_errors) {
    const char *texts[] = {"[train]\ncuda_graph = auto\n", "[train]\ncuda_graph = off\ndevice = cuda\n",
                           "[train]\ndevice = cuda\n[model]\nlayers = attn_dsa,gdn\n", "[model]\nlayers = gdn\n"};
    for (int i = 0; i < 4; i++) {
        TrainConfig cfg;
        Status s = validate_text(&cfg, texts[i]);
        cr_assert(s.ok, "case %d: %s", i, s.msg);
        cr_assert(cfg.train.cuda_graph != CFG_GRAPH_ON, "case %d", i);
        config_free(&cfg);
    }
    TrainConfig cfg;
    validate_text(&cfg, "[model]\nlayers = gdn\n");
    cr_assert_eq(cfg.train.cuda_graph, CFG_GRAPH_AUTO, "the default is auto");
    cr_assert_str_eq(config_cuda_graph_refusal(&cfg), "graphs need device = cuda");   // auto: off on the CPU
    config_free(&cfg);
}

Test(cuda_graph_config, on_with_a_mode_that_reads_the_host_is_refused) {
    TrainConfig cfg;
    Status s = validate_text(&cfg, "[model]\nlayers = gdn,attn_dsa\n[train]\ndevice = cuda\ncuda_graph = on\n");
    const char *why = device_cuda_built() ? "attn_dsa layers read their selection on the host inside the step"
                                          : "this build has no CUDA backend";
    char want[300];
    snprintf(want, sizeof want, "graph.ini:5: [train] cuda_graph = on: %s (auto turns graphs off there)", why);
    cr_assert_str_eq(s.msg, want);
    config_free(&cfg);
    s = validate_text(&cfg, "[model]\nlayers = gdn,attn\n[train]\ndevice = cuda\ncuda_graph = on\n");
    if (device_cuda_built()) cr_assert(s.ok, "%s", s.msg);
    else cr_assert(strstr(s.msg, "graph.ini:5: [train] cuda_graph = on: this build has no CUDA backend"), "%s", s.msg);
    config_free(&cfg);
}

Test(cuda_graph_config, a_value_outside_the_choices_is_an_error) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status s = config_load_string(&cfg, "[train]\ncuda_graph = yes\n", "graph.ini");
    cr_assert(!s.ok && strstr(s.msg, "graph.ini:2") && strstr(s.msg, "cuda_graph") && strstr(s.msg, "auto|on|off"),
              "%s", s.msg);
    config_free(&cfg);
}

// On a CPU tape there is no graph: lm_graph_micro_batch is the eager
// micro-batch (the loss, then the backward into the parameters' gradients),
// the same bits as building it by hand, and counts every micro-batch eager.
Test(cuda_graph_config, cpu_micro_batches_are_eager) {
    LMConfig cfg = test_tiny_lm_config("gdn,attn");
    ParamStore ps[2];
    LM lm[2];
    for (int i = 0; i < 2; i++) {
        params_init(&ps[i]);
        lm_create(&lm[i], &cfg, &ps[i]);
        params_finalize(&ps[i], 3);
    }
    int x[2 * 9], y[2 * 9], doc[2 * 9] = {0};
    for (int i = 0; i < 18; i++) x[i] = (i * 5 + 1) % cfg.vocab_size, y[i] = (i * 7 + 2) % cfg.vocab_size;
    doc[9 + 4] = 1;
    y[3] = -1;
    Tape tp;
    tape_init(&tp);
    LMGraph gr;
    lm_graph_init(&gr, DEVICE_CPU, true);
    cr_assert_null(gr.g, "a CPU tape has no graph");
    for (int k = 0; k < 3; k++) {
        double a = lm_graph_micro_batch(&gr, &tp, &lm[0], x, y, doc, 2, 9, NULL);
        Tensor *loss = lm_loss_docs(&tp, &lm[1], x, y, doc, 2, 9, NULL);
        double b = tape_item(&tp, loss);
        tape_backward(&tp, loss);
        tape_reset(&tp);
        cr_assert(memcmp(&a, &b, sizeof a) == 0, "micro-batch %d: loss %.17g, by hand %.17g", k, a, b);
    }
    cr_assert(memcmp(ps[0].grad, ps[1].grad, (size_t)ps[0].numel * sizeof(real)) == 0, "the gradients differ");
    cr_assert(gr.eager == 3 && gr.replays == 0 && gr.captures == 0 && !gr.off, "eager %lld", (long long)gr.eager);
    lm_graph_free(&gr);
    tape_free(&tp);
    for (int i = 0; i < 2; i++) {
        lm_destroy(&lm[i]);
        params_free(&ps[i]);
    }
}
