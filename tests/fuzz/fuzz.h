/* Fuzz targets for kvpd's input boundaries. Each fuzz_*.c defines libFuzzer's entry
 * point; built with `-Dfuzz=true` (clang) they are libFuzzer binaries, and in every
 * build replay.c runs the same entry point over a committed corpus (tests/fuzz/corpus/
 * <target>/: seeds and every input that once crashed), so the suite re-checks them
 * under gcc and ASan + UBSan without libFuzzer. */
#ifndef KVP_TESTS_FUZZ_H
#define KVP_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
