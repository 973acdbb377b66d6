// data_dir.h: where the bundled data (configs/, bpe/) was installed.
//
// `cmake --install build --prefix P` may choose a prefix other than the one
// the build was configured with (CMAKE_INSTALL_PREFIX, /usr/local by
// default), so the path compiled in is only a fallback: an installed program
// finds share/attnlab relative to its own executable (P/bin/train ->
// P/share/attnlab), which holds for any prefix and after the install is moved.
#ifndef DATA_DIR_H
#define DATA_DIR_H

#include <stddef.h>

// The installed share/attnlab beside this executable when there is one, else
// the configured ATTNLAB_DATA_DIR. The string lives for the whole process.
const char *attnlab_data_dir(void);

// The same, for the executable at exe_path (testable without installing).
// Writes into out (n bytes) and returns out.
const char *attnlab_data_dir_for(const char *exe_path, char *out, size_t n);

#endif
