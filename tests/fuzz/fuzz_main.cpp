// libFuzzer entry point: one executable per target, chosen at compile time (KVPFUZZ_TARGET).
#include <stddef.h>
#include <stdint.h>

#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvpfuzz::KVPFUZZ_TARGET(data, size);
    return 0;
}
