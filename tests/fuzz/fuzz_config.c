// fuzz_config: the INI parser, the validator and the dump round trip.
// Input: INI text, or (first byte 's') one --set assignment. Invariants:
// nothing crashes or leaks; a config that validates is written by
// config_dump and read back to the same text; its model can be registered
// (every constraint the layers assert was checked by validation).
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_util.h"
#include "lm.h"
#include "model_setup.h"

static void fail(const char *what, const char *a, const char *b) {
    fprintf(stderr, "fuzz_config: %s\n--- first\n%s\n--- second\n%s\n", what, a, b ? b : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    TrainConfig cfg;
    config_defaults(&cfg, model_mixer_known);
    Status s = size && data[0] == 's' ? config_set(&cfg, text + 1) : config_load_string(&cfg, text, "fuzz.ini");
    if (s.ok) s = config_validate(&cfg);
    if (s.ok) {
        char *dump = config_dump_string(&cfg);
        TrainConfig back;
        config_defaults(&back, model_mixer_known);
        Status b = config_load_string(&back, dump, "dump");
        if (!b.ok) fail(b.msg, dump, NULL);
        char *again = config_dump_string(&back);
        if (strcmp(dump, again) != 0) fail("the dump does not read back to itself", dump, again);
        if (!config_validate(&back).ok) fail("the dump does not validate", dump, NULL);
        // Register the model's parameters (no allocation of their values).
        LMConfig lc;
        if (config_model(&cfg, &lc).ok) {
            ParamStore ps;
            LM lm;
            params_init(&ps);
            lm_create(&lm, &lc, &ps);
            lm_destroy(&lm);
            params_free(&ps);
        }
        free(dump);
        free(again);
        config_free(&back);
    }
    config_free(&cfg);
    free(text);
    return 0;
}
