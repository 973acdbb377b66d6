// fuzz_checkpoint_raw: the fuzzer's bytes are the whole checkpoint file,
// handed to every loader (ckpt_loaders.h). libhdf5 reads such a file's
// structure only in h5io's sandboxed child, so this fuzzes that boundary:
// whatever libhdf5 does with the bytes (crash, loop, allocate 2^63 bytes),
// the loaders must answer with an error, never crash, leak or hang. Seeds:
// a valid checkpoint of the fuzzers' model and files that crashed libhdf5.
#include "ckpt_loaders.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("raw.h5");
    fuzz_write_file(path, data, size);
    ckpt_load_every_way(path);
    return 0;
}
