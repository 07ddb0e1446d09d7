#!/usr/bin/env bash
# Cross builds and cross-ISA checks (Debian 12; installs what it needs with apt-get):
#
#   aarch64  GoogleTest cross-built from /usr/src/googletest, then the library and the
#            test suite (less QEMU_EXCLUDE, below) for aarch64-linux-gnu (SIMDe -> NEON), run by ctest under qemu-aarch64.
#   armhf    the same for 32-bit ARM (arm-linux-gnueabihf, SIMDe portable path) under qemu-arm, plain
#            -O2. Not in the default list: ubsan32 below builds the same target and code path and
#            runs the same tests (the cross builds have no harness: KVP_BUILD_BENCH=OFF), so this
#            step only repeats it at -O2 (18 CI minutes); name it to run it.
#   ubsan32  the armhf build (32-bit, SIMDe portable path) under UBSan with alignment checks
#            (-fsanitize=undefined,alignment, no recovery), the whole suite under qemu-arm: the
#            32-bit target, where size_t overflow checks matter (issue 11), and stores through
#            over-aligned SIMDe types at 4-byte-aligned addresses (issue 22 defect 1: simde__m64 in
#            qk_rows), which x86 native builds hide.
#   The qemu runs leave out QEMU_EXCLUDE: the thread-count sweeps and the allocation counters
#   (Threads.SameBitsForEveryThreadCountAndSchedule, Compose.EveryPolicyDtypeAndThink...OnAnyThreads,
#   NoAllocation.*). Their subject is ISA-independent (work partitioning, heap use), qemu-user
#   runs the guest's threads with the x86 host's memory ordering, so it cannot show an ARM
#   ordering race, and its futex emulation made them 40-120x slower than native (half of the
#   aarch64 step's CPU time). They run natively in the core and asan stages; the Cortex-M nm
#   check covers heap-freedom on ARM. Also left out: State.EditedStatesLoadSafelyOrAreRefused
#   (issue 29: ~40k edited-state loads, 4 s natively); its subject, the load's checks of buffer
#   words, is ISA-independent, and FuzzState.CorpusAndMutations still runs the same checks on
#   every seed state with word edits under qemu (32-bit size_t on armhf included). And
#   Policies/ChunkedEqualsOneCall.* (issue 28: 20 policies x 3 dtypes x 2 thread counts x 6
#   chunkings, 4 s natively): chunked == one call is the prompt logic's bookkeeping, the same code
#   on every ISA; the rest of test_prompt (every prompt path, each policy family) runs under qemu.
#   hash     tests/test_hash (KVP_HASH lines) on x86-64 and aarch64 (qemu): the portable SIMD
#            path (SIMDE_NO_NATIVE, KVP_AVX2=OFF, -ffp-contract=off) must give the same hash on
#            both (fails otherwise); the native paths (AVX2/FMA dispatch vs NEON, default flags)
#            are compared and reported only. The score=fixed eviction decisions (`KVP_HASH
#            fixed`) must be identical on all four builds: x86-64 AVX2, x86-64 SIMDE_NO_NATIVE,
#            aarch64 portable and aarch64 native (fails otherwise).
#   cortexm  heap-free Cortex-M7 (and M4F) build with arm-none-eabi: nm check that no object
#            references an allocator, operator new/delete or the exception runtime; code size;
#            a bare-metal example linked with newlib-nano, whose image must contain no allocator.
#
#   bash .ci/cross.sh                 # aarch64 ubsan32 hash cortexm
#   bash .ci/cross.sh cortexm hash    # a subset (armhf only when named)
#
# Env: JOBS (default 2), CROSS_CTEST_ARGS (extra ctest args for the qemu runs),
#      QEMU_EXCLUDE (ctest -E regex of the qemu runs; empty runs every test),
#      CROSS_HASH_NOCONTRACT=1 (also compare the native paths built with -ffp-contract=off).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-2}
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(aarch64 ubsan32 hash cortexm)
QEMU_EXCLUDE=${QEMU_EXCLUDE-'^(Threads\.SameBitsForEveryThreadCountAndSchedule|Compose\.EveryPolicyDtypeAndThinkRunsBoundedWithTheSameBitsOnAnyThreads|NoAllocation\..*|State\.EditedStatesLoadSafelyOrAreRefused|Policies/ChunkedEqualsOneCall\..*)$'}
qemu_args=()
[ -n "$QEMU_EXCLUDE" ] && qemu_args=(-E "$QEMU_EXCLUDE")
want() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
t0=$(date +%s)
log() { echo "== cross: $* (+$(( $(date +%s) - t0 ))s)"; }
summary=()
status=0

# ---- packages ----
pkgs=(cmake ninja-build g++ pkg-config libsimde-dev)
want aarch64 || want hash && pkgs+=(g++-aarch64-linux-gnu qemu-user googletest libgtest-dev)
# (not g++-multilib for an i386 build: Debian's gcc-multilib conflicts with the aarch64 cross compiler)
want armhf || want ubsan32 && pkgs+=(g++-arm-linux-gnueabihf qemu-user googletest libgtest-dev)
want cortexm && pkgs+=(gcc-arm-none-eabi binutils-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

A64_TC=$ROOT/cmake/toolchains/aarch64-linux-gnu.cmake
CM_TC=$ROOT/cmake/toolchains/arm-none-eabi.cmake
A64=$ROOT/build-aarch64
QEMU=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
# OpenMP workers that sleep instead of spinning: much faster under user-mode emulation.
export OMP_WAIT_POLICY=passive

cfg() {  # cfg <build dir> <cmake args...>: configure quietly, print the log on failure
  local dir=$1; shift
  mkdir -p "$dir"
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVP_BUILD_BENCH=OFF "$@" >"$dir/configure.log" 2>&1 \
    || { cat "$dir/configure.log"; return 1; }
}

gtest_aarch64() {  # GoogleTest for aarch64 from Debian's sources, installed under $A64/gtest
  if [ ! -f "$A64/gtest/lib/cmake/GTest/GTestConfig.cmake" ]; then
    log "googletest for aarch64"
    cmake -S /usr/src/googletest -B "$A64/gtest-build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$A64_TC" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$A64/gtest" >/dev/null
    cmake --build "$A64/gtest-build" -j"$JOBS" >/dev/null
    cmake --install "$A64/gtest-build" >/dev/null
  fi
}

# ---- aarch64: the suite under qemu (less QEMU_EXCLUDE) ----
if want aarch64 || want hash; then
  gtest_aarch64
  log "aarch64 build (native: SIMDe -> NEON)"
  cfg "$A64/native" -DCMAKE_TOOLCHAIN_FILE="$A64_TC" -DCMAKE_PREFIX_PATH="$A64/gtest"
  if want aarch64; then
    cmake --build "$A64/native" -j"$JOBS"
  else
    cmake --build "$A64/native" -j"$JOBS" --target test_hash
  fi
fi
if want aarch64; then
  log "aarch64 ctest under qemu-aarch64"
  # shellcheck disable=SC2086
  if (cd "$A64/native" && ctest -j"$JOBS" --timeout 900 --output-on-failure "${qemu_args[@]}" ${CROSS_CTEST_ARGS:-}); then
    summary+=("aarch64 ctest under qemu: passed")
  else
    status=1; summary+=("aarch64 ctest under qemu: FAILED")
  fi
fi

# ---- armhf (32-bit): the suite under qemu-arm (less QEMU_EXCLUDE), only when named ----
ARMHF=$ROOT/build-armhf
ARMHF_TC=$ROOT/cmake/toolchains/arm-linux-gnueabihf.cmake
gtest_armhf() {  # GoogleTest for armhf from Debian's sources, installed under $ARMHF/gtest
  if [ ! -f "$ARMHF/gtest/lib/cmake/GTest/GTestConfig.cmake" ]; then
    log "googletest for armhf"
    cmake -S /usr/src/googletest -B "$ARMHF/gtest-build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$ARMHF_TC" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$ARMHF/gtest" >/dev/null
    cmake --build "$ARMHF/gtest-build" -j"$JOBS" >/dev/null
    cmake --install "$ARMHF/gtest-build" >/dev/null
  fi
}
if want armhf; then
  gtest_armhf
  log "armhf build (32-bit)"
  cfg "$ARMHF/native" -DCMAKE_TOOLCHAIN_FILE="$ARMHF_TC" -DCMAKE_PREFIX_PATH="$ARMHF/gtest"
  cmake --build "$ARMHF/native" -j"$JOBS"
  log "armhf ctest under qemu-arm"
  # shellcheck disable=SC2086
  if (cd "$ARMHF/native" && ctest -j"$JOBS" --timeout 900 --output-on-failure "${qemu_args[@]}" ${CROSS_CTEST_ARGS:-}); then
    summary+=("armhf (32-bit) ctest under qemu: passed")
  else
    status=1; summary+=("armhf (32-bit) ctest under qemu: FAILED")
  fi
fi

# ---- ubsan32: the 32-bit portable build under UBSan (alignment included) ----
if want ubsan32; then
  gtest_armhf
  log "armhf UBSan build (32-bit, SIMDe portable, -fsanitize=undefined,alignment)"
  UBSAN_FLAGS="-O1 -g -fsanitize=undefined -fsanitize=alignment -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cfg "$ARMHF/ubsan" -DCMAKE_TOOLCHAIN_FILE="$ARMHF_TC" -DCMAKE_PREFIX_PATH="$ARMHF/gtest" \
    -DCMAKE_C_FLAGS="$UBSAN_FLAGS" -DCMAKE_CXX_FLAGS="$UBSAN_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=undefined"
  cmake --build "$ARMHF/ubsan" -j"$JOBS"
  log "armhf UBSan ctest under qemu-arm"
  # shellcheck disable=SC2086
  if (cd "$ARMHF/ubsan" && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest -j"$JOBS" --timeout 900 --output-on-failure "${qemu_args[@]}" ${CROSS_CTEST_ARGS:-}); then
    summary+=("armhf (32-bit) UBSan ctest under qemu: passed")
  else
    status=1; summary+=("armhf (32-bit) UBSan ctest under qemu: FAILED")
  fi
fi

# ---- determinism hash across ISAs ----
HASH_OUT=$ROOT/build-hash/out
hash_of() {  # hash_of <tag> <runner...> <binary>: the `KVP_HASH all` value (or "none"); the
  local tag=$1 out; shift  # whole output is kept in $HASH_OUT/<tag>.txt (fixed_of reads it)
  mkdir -p "$HASH_OUT"
  out=$("$@" --gtest_filter='DeterminismHash.*' 2>&1) || { echo "$out" >&2; echo "$out" >"$HASH_OUT/$tag.txt"; echo none; return 0; }
  echo "$out" >"$HASH_OUT/$tag.txt"
  echo "$out" | grep '^KVP_HASH ' >&2
  echo "$out" | sed -n 's/^KVP_HASH all \([0-9a-f]*\)$/\1/p'
}
fixed_of() {  # fixed_of <tag>: the `KVP_HASH fixed` value of that run (or "none")
  local v
  v=$(sed -n 's/^KVP_HASH fixed \([0-9a-f]*\)$/\1/p' "$HASH_OUT/$1.txt" 2>/dev/null)
  echo "${v:-none}"
}
if want hash; then
  PORTABLE_FLAGS="-DSIMDE_NO_NATIVE -ffp-contract=off"
  log "hash builds: x86-64 native, x86-64 portable, aarch64 portable"
  cfg "$ROOT/build-hash/x86-native"
  cmake --build "$ROOT/build-hash/x86-native" -j"$JOBS" --target test_hash
  cfg "$ROOT/build-hash/x86-portable" -DKVP_AVX2=OFF -DCMAKE_CXX_FLAGS="$PORTABLE_FLAGS"
  cmake --build "$ROOT/build-hash/x86-portable" -j"$JOBS" --target test_hash
  cfg "$A64/portable" -DCMAKE_TOOLCHAIN_FILE="$A64_TC" -DCMAKE_PREFIX_PATH="$A64/gtest" -DCMAKE_CXX_FLAGS="$PORTABLE_FLAGS"
  cmake --build "$A64/portable" -j"$JOBS" --target test_hash

  log "x86-64 portable";  hx_p=$(hash_of x86-portable "$ROOT/build-hash/x86-portable/tests/test_hash")
  log "aarch64 portable"; ha_p=$(hash_of a64-portable "${QEMU[@]}" "$A64/portable/tests/test_hash")
  log "x86-64 native";    hx_n=$(hash_of x86-native "$ROOT/build-hash/x86-native/tests/test_hash")
  log "aarch64 native";   ha_n=$(hash_of a64-native "${QEMU[@]}" "$A64/native/tests/test_hash")
  echo "KVP_HASH_COMPARE portable x86-64=$hx_p aarch64=$ha_p"
  echo "KVP_HASH_COMPARE native   x86-64=$hx_n aarch64=$ha_n"
  fx_xn=$(fixed_of x86-native); fx_xp=$(fixed_of x86-portable); fx_ap=$(fixed_of a64-portable); fx_an=$(fixed_of a64-native)
  echo "KVP_HASH_COMPARE fixed    x86-64-avx2=$fx_xn x86-64-portable=$fx_xp aarch64-portable=$fx_ap aarch64-native=$fx_an"
  if [ "$fx_xn" != none ] && [ "$fx_xn" = "$fx_xp" ] && [ "$fx_xn" = "$fx_ap" ] && [ "$fx_xn" = "$fx_an" ]; then
    summary+=("score=fixed decisions hash: x86-64 AVX2 == x86-64 portable == aarch64 portable == aarch64 native ($fx_xn)")
  else
    status=1; summary+=("score=fixed decisions hash: MISMATCH avx2=$fx_xn x86-portable=$fx_xp a64-portable=$fx_ap a64-native=$fx_an")
  fi
  if [ "$hx_p" != none ] && [ -n "$hx_p" ] && [ "$hx_p" = "$ha_p" ]; then
    summary+=("determinism hash, portable path: x86-64 == aarch64 ($hx_p)")
  else
    status=1; summary+=("determinism hash, portable path: MISMATCH x86-64=$hx_p aarch64=$ha_p")
  fi
  if [ "${CROSS_HASH_NOCONTRACT:-0}" = 1 ]; then  # opt-in: native paths with -ffp-contract=off
    log "hash builds: native with -ffp-contract=off"
    cfg "$ROOT/build-hash/x86-native-nc" -DCMAKE_CXX_FLAGS=-ffp-contract=off
    cmake --build "$ROOT/build-hash/x86-native-nc" -j"$JOBS" --target test_hash
    cfg "$A64/native-nc" -DCMAKE_TOOLCHAIN_FILE="$A64_TC" -DCMAKE_PREFIX_PATH="$A64/gtest" -DCMAKE_CXX_FLAGS=-ffp-contract=off
    cmake --build "$A64/native-nc" -j"$JOBS" --target test_hash
    hx_c=$(hash_of x86-native-nc "$ROOT/build-hash/x86-native-nc/tests/test_hash")
    ha_c=$(hash_of a64-native-nc "${QEMU[@]}" "$A64/native-nc/tests/test_hash")
    echo "KVP_HASH_COMPARE native-ffp-contract-off x86-64=$hx_c aarch64=$ha_c"
    summary+=("determinism hash, native paths with -ffp-contract=off: $([ "$hx_c" = "$ha_c" ] && echo match || echo differ) (x86-64=$hx_c aarch64=$ha_c)")
  fi
  if [ "$hx_n" = "$ha_n" ] && [ "$hx_n" != none ]; then
    summary+=("determinism hash, native paths: match ($hx_n)")
  else
    summary+=("determinism hash, native paths: differ (x86-64=$hx_n aarch64=$ha_n; reported, not a failure)")
  fi
fi

# ---- Cortex-M: heap-free build, nm check, size ----
FORBIDDEN='^(malloc|calloc|realloc|free|aligned_alloc|posix_memalign|memalign|valloc|pvalloc|_malloc_r|_calloc_r|_realloc_r|_free_r|_sbrk|_sbrk_r|sbrk|_Znw.*|_Zna.*|_Zdl.*|_Zda.*|__cxa_.*|_Unwind_.*|__gxx_personality_.*|__aeabi_unwind_cpp_pr.*|_ZSt.*__throw_.*|_ZTI.*|_ZTS.*)$'
if want cortexm; then
  for cpu in cortex-m7 cortex-m4; do
    dir=$ROOT/build-cortexm; [ $cpu = cortex-m4 ] && dir=$ROOT/build-cortexm-m4
    log "arm-none-eabi $cpu (KVP_NO_HEAP=ON, KVP_THREADS=OFF, MinSizeRel)"
    mkdir -p "$dir"
    cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$CM_TC" -DKVP_CORTEX_CPU=$cpu \
      -DCMAKE_BUILD_TYPE=MinSizeRel >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
    cmake --build "$dir" -j"$JOBS"
    lib=$dir/libkvprune.a
    # Every symbol the objects reference but do not define.
    bad=$(arm-none-eabi-nm -u "$lib" | awk 'NF==2 && $1=="U" {print $2}' | sort -u | grep -E "$FORBIDDEN" || true)
    if [ -n "$bad" ]; then
      echo "forbidden symbols referenced by $lib:"
      for s in $bad; do
        echo "  $s ($(echo "$s" | arm-none-eabi-c++filt)) in: $(arm-none-eabi-nm -A -u "$lib" | grep -w "$s" | sed 's/:.*//; s/.*(//; s/).*//' | sort -u | tr '\n' ' ')"
      done
      status=1; summary+=("cortex-m ($cpu) nm check: FAILED")
    else
      summary+=("cortex-m ($cpu) nm check: no allocator/new/delete/exception symbols")
    fi
    echo "undefined symbols of $lib (all resolved by libc/libm/libgcc):"
    arm-none-eabi-nm --defined-only "$lib" | awk 'NF==3 {print $3}' | sort -u >"$dir/defined.txt"
    arm-none-eabi-nm -u "$lib" | awk 'NF==2 {print $2}' | sort -u | comm -23 - "$dir/defined.txt" | tr '\n' ' '; echo
    arm-none-eabi-size -t "$lib"
    tot=$(arm-none-eabi-size -t "$lib" | tail -1)
    summary+=("cortex-m ($cpu) libkvprune.a size: text data bss = $(echo "$tot" | awk '{print $1, $2, $3}') bytes")

    # Firmware-style link of an example with newlib-nano: the image must hold no allocator.
    flags=$(sed -n 's/^CMAKE_CXX_FLAGS:STRING=//p' "$dir/CMakeCache.txt")
    cpuflags=$(echo "$flags" | grep -oE -- '-m(cpu|fpu|float-abi|thumb)[^ ]*' | tr '\n' ' ')
    elf=$dir/fw_example.elf
    # shellcheck disable=SC2086
    arm-none-eabi-gcc $cpuflags -fno-short-enums -Os -ffunction-sections -fdata-sections -I"$ROOT/include" \
      -c "$ROOT/ports/cortexm/fw_example.c" -o "$dir/fw_example.o"
    # shellcheck disable=SC2086
    arm-none-eabi-g++ $cpuflags -Os --specs=nano.specs --specs=nosys.specs -Wl,--gc-sections \
      -Wl,--no-warn-mismatch "$dir/fw_example.o" "$lib" -lm -o "$elf" 2>"$dir/fw_link.log" \
      || { cat "$dir/fw_link.log"; status=1; }
    if [ -f "$elf" ]; then
      fbad=$(arm-none-eabi-nm "$elf" | awk '{print $NF}' | grep -E "$FORBIDDEN" || true)
      arm-none-eabi-size "$elf"
      if [ -n "$fbad" ]; then
        status=1; summary+=("cortex-m ($cpu) example firmware: contains $(echo $fbad)")
      else
        summary+=("cortex-m ($cpu) example firmware (newlib-nano, gc-sections): $(arm-none-eabi-size "$elf" | tail -1 | awk '{print "text " $1 ", data " $2 ", bss " $3}') bytes, no allocator")
      fi
    fi
  done
fi

log "done"
for s in "${summary[@]}"; do echo "cross: $s"; done
# Checks that can fail (informational lines such as sizes and the native hash comparison aside).
nfail=$(printf '%s\n' "${summary[@]}" | grep -cE 'FAILED|MISMATCH|contains' || true)
npass=$(printf '%s\n' "${summary[@]}" | grep -cE ': passed|nm check: no |portable path: x86-64 ==|decisions hash: x86-64|no allocator$' || true)
echo "cross: $npass passed, $nfail failed"
exit $status
