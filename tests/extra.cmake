# Included by tests/CMakeLists.txt when present (owned by the ports/platforms work).
# Cross-ISA determinism hash: prints `KVP_HASH <name> <hex>` lines that .ci/cross.sh compares
# between x86-64 and aarch64 builds.
kvp_add_gtest(test_hash test_hash.cpp)
