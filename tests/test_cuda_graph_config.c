// test_cuda_graph_config.c: [train] cuda_graph = auto|on|off (docs/cuda.md
// "CUDA graphs"): on where graphs cannot run is a config error naming the
// source, line and key and why; auto turns them off there without an error.
#include <criterion/criterion.h>
#include <string.h>

#include "config.h"
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
