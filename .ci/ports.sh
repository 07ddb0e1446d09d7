#!/usr/bin/env bash
# Builds and installs libkvprune.a (host, x86-64 or whatever this is), then runs the test
# suites of the three ports against it: Rust (cargo test --offline), Go (go test, cgo +
# pkg-config), Python (python3 -m unittest, ctypes over a shared object linked from the
# static library). Standard libraries only; nothing is fetched but Debian packages.
#
#   bash .ci/ports.sh            # all three, then the README's binding commands (readme)
#   bash .ci/ports.sh rust go    # a subset
#   bash .ci/ports.sh readme     # only: the README block under "<!-- readme-commands -->", run
#                                # as written in a fresh clone of this checkout's HEAD
#
# Env: BUILD_DIR (default build-ports), PREFIX (default _install), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-$ROOT/build-ports}
PREFIX=${PREFIX:-$ROOT/_install}
JOBS=${JOBS:-2}
PORTS=("$@")
[ ${#PORTS[@]} -eq 0 ] && PORTS=(rust go python readme)
want() { local p; for p in "${PORTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
t0=$(date +%s)
log() { echo "== ports: $* (+$(( $(date +%s) - t0 ))s)"; }

# ---- tools (fresh Debian 12) ----
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/simde/x86/avx2.h ] || need+=(libsimde-dev)
want go && ! command -v go >/dev/null && need+=(golang-go)
want rust && ! command -v cargo >/dev/null && need+=(cargo)
want python && ! command -v python3 >/dev/null && need+=(python3)
# numpy (Debian's) covers the binding's numpy paths; venv for the README's `pip install` steps
want python && ! /usr/bin/python3 -c 'import numpy' 2>/dev/null && need+=(python3-numpy)
want python && ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null && need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

# ---- the README's commands, in a fresh clone ----
if want readme; then
  log "readme: the README's binding commands in a fresh clone of HEAD"
  fresh=$(mktemp -d)
  git clone -q "$ROOT" "$fresh/kvprune"
  awk '/^<!-- readme-commands -->$/ {on=1; next} on && /^```sh$/ {inblk=1; next} inblk && /^```$/ {exit} inblk {print}' \
    "$fresh/kvprune/README.md" > "$fresh/commands.sh"
  if [ ! -s "$fresh/commands.sh" ]; then echo "README has no readme-commands block" >&2; exit 1; fi
  cat "$fresh/commands.sh"
  if (cd "$fresh/kvprune" && env -u PKG_CONFIG_PATH -u KVPRUNE_LIB -u KVPRUNE_LIB_DIR -u CARGO_TARGET_DIR \
        bash -euo pipefail "$fresh/commands.sh" > "$fresh/log" 2>&1); then
    summary_readme="readme commands in a fresh clone: 1 passed, 0 failed"
  else
    tail -40 "$fresh/log"
    summary_readme="readme commands in a fresh clone: FAILED"
  fi
  rm -rf "$fresh"
  if [ "${PORTS[*]}" = readme ]; then
    echo "$summary_readme"
    case "$summary_readme" in *FAILED) exit 1 ;; esac
    exit 0
  fi
fi

# ---- library: build + install (static, PIC, OpenMP) ----
log "build libkvprune.a -> $PREFIX"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DKVP_BUILD_TESTS=OFF -DKVP_BUILD_BENCH=OFF >"$BUILD_DIR/cmake.log" 2>&1 || { cat "$BUILD_DIR/cmake.log"; exit 1; }
cmake --build "$BUILD_DIR" -j"$JOBS" --target kvprune
cmake --install "$BUILD_DIR" >/dev/null
LIBDIR=$(ls -d "$PREFIX"/lib*/pkgconfig | head -1)
export PKG_CONFIG_PATH="$LIBDIR${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
log "pkg-config --static --libs kvprune: $(pkg-config --static --libs kvprune)"

status=0
summary=()

# ---- Rust ----
if want rust; then
  log "rust: cargo test --offline"
  if (cd ports/rust && CARGO_TARGET_DIR="$BUILD_DIR/cargo" CARGO_NET_OFFLINE=true \
        cargo test --offline 2>&1 | tee "$BUILD_DIR/rust.log"; exit "${PIPESTATUS[0]}"); then
    summary+=("rust: $(grep -E '^test result:' "$BUILD_DIR/rust.log" | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}')")
  else
    status=1; summary+=("rust: FAILED")
  fi
fi

# ---- Go ----
if want go; then
  log "go: go test"
  export GOPATH="$BUILD_DIR/gopath" GOCACHE="$BUILD_DIR/gocache" GOPROXY=off GOFLAGS=-mod=mod GO111MODULE=on
  export CGO_ENABLED=1
  export GODEBUG=cgocheck=2   # full cgo pointer checks: no Go pointer may be kept by C
  if (cd ports/go && go vet ./... && go test -count=1 -v ./... 2>&1 | tee "$BUILD_DIR/go.log"; exit "${PIPESTATUS[0]}"); then
    gp=$(grep -c -- '^--- PASS' "$BUILD_DIR/go.log" || true)
    gf=$(grep -c -- '^--- FAIL' "$BUILD_DIR/go.log" || true)
    summary+=("go: $gp passed, $gf failed")
  else
    status=1; summary+=("go: FAILED")
  fi
  # Another module requires the binding by its module path; a go.work points at this checkout
  # (the documented steps: no replace directive, nothing fetched).
  log "go: a consumer module (go.work, GOPROXY=off)"
  gw=$(mktemp -d)
  cp ports/go/example/consumer/go.mod ports/go/example/consumer/main.go "$gw/"
  printf 'go 1.19\n\nuse (\n\t.\n\t%s\n)\n' "$ROOT/ports/go" > "$gw/go.work"
  if (cd "$gw" && GOFLAGS= go run . | tee "$BUILD_DIR/go-consumer.log"; exit "${PIPESTATUS[0]}") \
      && grep -q "consumer: 1 token" "$BUILD_DIR/go-consumer.log"; then
    summary+=("go consumer module: 1 passed, 0 failed")
  else
    status=1; summary+=("go consumer module: FAILED")
  fi
  rm -rf "$gw"
fi

# ---- Python ----
if want python; then
  log "python: shared object from libkvprune.a + python3 -m unittest"
  export KVPRUNE_LIB="$BUILD_DIR/libkvprune.so"
  # Any python3 works (standard library only); prefer one that has numpy, to cover that path too.
  PY=${PYTHON:-python3}
  if ! "$PY" -c 'import numpy' 2>/dev/null && [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    PY=/usr/bin/python3
  fi
  log "python: $PY ($("$PY" --version 2>&1))"
  "$PY" -c "import sys; sys.path.insert(0, 'ports/python'); import kvprune; kvprune.build_shared_library('$KVPRUNE_LIB')"
  if (cd ports/python && "$PY" -m unittest discover -s tests -v 2>&1 | tee "$BUILD_DIR/python.log"; exit "${PIPESTATUS[0]}"); then
    :
  else
    status=1
  fi
  ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in.*/\1/p' "$BUILD_DIR/python.log" | tail -1)
  bad=$(grep -cE '^(FAIL|ERROR):' "$BUILD_DIR/python.log" || true)
  skip=$(grep -cE ' \.\.\. skipped' "$BUILD_DIR/python.log" || true)
  summary+=("python: $(( ${ran:-0} - bad - skip )) passed, $bad failed, $skip skipped")

  # `pip install ./ports/python` (offline) without the installed library: with no cmake either it
  # must fail and say what to do; with cmake it builds the library from this checkout, and the
  # installed package then passes the suite with no KVPRUNE_LIB.
  log "python: pip install without the installed library (no cmake: fails; cmake: builds it)"
  venv="$BUILD_DIR/pip-venv"
  rm -rf "$venv"
  VPY=/usr/bin/python3
  "$VPY" -c 'import venv, ensurepip' 2>/dev/null || VPY=$PY
  "$VPY" -m venv "$venv"
  pip_ok=0
  if env -u PKG_CONFIG_PATH -u KVPRUNE_LIB PKG_CONFIG=false CMAKE=/nonexistent/cmake \
       "$venv/bin/pip" install -q --no-index ./ports/python > "$BUILD_DIR/pip-nocmake.log" 2>&1; then
    echo "pip install succeeded without the library and without cmake" >&2
  elif grep -q "cannot build the Python package" "$BUILD_DIR/pip-nocmake.log" \
       && grep -q "PKG_CONFIG_PATH=" "$BUILD_DIR/pip-nocmake.log"; then
    pip_ok=$((pip_ok + 1))
  else
    tail -20 "$BUILD_DIR/pip-nocmake.log"
  fi
  if env -u PKG_CONFIG_PATH -u KVPRUNE_LIB PKG_CONFIG=false KVPRUNE_BUILD_DIR="$BUILD_DIR/pip-cmake" \
       CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$venv/bin/pip" install -q --no-index ./ports/python \
       > "$BUILD_DIR/pip-cmake.log" 2>&1 \
     && (cd "$BUILD_DIR" && env -u KVPRUNE_LIB -u KVPRUNE_LIB_DIR "$venv/bin/python" -m unittest discover \
           -s "$ROOT/ports/python/tests" > "$BUILD_DIR/pip-cmake-tests.log" 2>&1) \
     && grep -q "site-packages/kvprune" <(cd "$BUILD_DIR" && "$venv/bin/python" -c 'import kvprune; print(kvprune.__file__)'); then
    pip_ok=$((pip_ok + 1))
  else
    tail -30 "$BUILD_DIR/pip-cmake.log" "$BUILD_DIR/pip-cmake-tests.log" 2>/dev/null
  fi
  [ $pip_ok -eq 2 ] || status=1
  summary+=("python pip install without the library (no cmake: refused; cmake: built, suite passes): $pip_ok passed, $(( 2 - pip_ok )) failed")
  rm -rf "$venv"
fi

# ---- parity: every function of the C header is in docs/ports.md's table and in each binding ----
if want rust && want go && want python; then
  log "parity: kvprune.h functions vs docs/ports.md and the three bindings"
  # kvp_config_default(_ex), kvp_config_init and kvp_create: the bindings call the sized and
  # explained forms instead (kvp_config_init_ex, kvp_create_ex); the table still lists them.
  exempt=" kvp_config_default kvp_config_default_ex kvp_config_init kvp_create "
  missing=()
  nfn=0
  for fn in $(grep -E '^[a-z].*\bkvp_[a-z0-9_]+\(' include/kvprune/kvprune.h | grep -oE 'kvp_[a-z0-9_]+\(' | tr -d '(' | sort -u); do
    nfn=$((nfn + 1))
    grep -q "^| \`$fn\`" docs/ports.md || missing+=("$fn: no row in docs/ports.md")
    case "$exempt" in *" $fn "*) continue ;; esac
    grep -q "fn $fn(" ports/rust/src/ffi.rs || missing+=("$fn: not in ports/rust/src/ffi.rs")
    grep -q "C\.$fn(" ports/go/kvprune.go || missing+=("$fn: not in ports/go/kvprune.go")
    grep -q "\"$fn\"" ports/python/kvprune/__init__.py || missing+=("$fn: not in ports/python/kvprune/__init__.py")
  done
  if [ ${#missing[@]} -eq 0 ] && [ $nfn -gt 20 ]; then
    summary+=("parity: $nfn C functions, each in docs/ports.md and every binding: 1 passed, 0 failed")
  else
    printf '  %s\n' "${missing[@]}" >&2
    status=1; summary+=("parity: FAILED (${#missing[@]} missing of $nfn functions)")
  fi
fi

log "done"
if [ -n "${summary_readme:-}" ]; then
  summary+=("$summary_readme")
  case "$summary_readme" in *FAILED) status=1 ;; esac
fi
for s in "${summary[@]}"; do echo "$s"; done
exit $status
