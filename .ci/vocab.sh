#!/usr/bin/env bash
# llama.cpp's own tokenizer test vectors (issue 29): `kvprune tokenize --chunks` on each claimed
# vocabulary's models/ggml-vocab-NAME.gguf.inp must give its .gguf.out line for line (test-tokenizer-0's
# format: chunks separated by "\n__ggml_vocab_test__\n", one line of space-separated ids per chunk,
# no BOS, parse_special off). The other vocabularies of that folder are run and reported, not required.
#
# llama.cpp comes from npm (no git host needed): node-llama-cpp ships llama.cpp's source as a git
# bundle (package/llama/gitRelease.bundle), cloned here and checked against the pinned commit.
# Everything is cached under BUILD/llama.cpp-vocab (a second run only tokenizes).
#
#   bash .ci/vocab.sh [BUILD]   (default: build; configured and kvprune_cli built there when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PKG=node-llama-cpp@3.21.1  # llama.cpp release tag named by the package; one squashed commit of 2026-09-12
COMMIT=80fb11ac73e66d89eae2c6a91d8a77428fa733ed
# claimed: equal ids on every chunk (tokenizer.ggml.pre / model in parentheses)
CLAIMED=(llama-spm phi-3 llama-bpe qwen2 qwen35 gpt-2 mpt starcoder refact command-r falcon deepseek-coder)
# not claimed (docs/harness.md "Tokenizers" says why): deepseek-llm (pre-tokenizer regexes not
# implemented), bert-bge (WordPiece), gemma-4 (model gemma4)
t0=$(date +%s)

command -v git >/dev/null || bash .ci/deps.sh git
command -v npm >/dev/null || bash .ci/deps.sh npm
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD" --target kvprune_cli -j"${JOBS:-$(nproc)}" >/dev/null
KVP=$BUILD/bench/harness/kvprune

CACHE=$BUILD/llama.cpp-vocab
SRC=$CACHE/llama.cpp
mkdir -p "$CACHE"
if [ "$(git -C "$SRC" rev-parse HEAD 2>/dev/null || true)" != "$COMMIT" ]; then
  tgz=$CACHE/node-llama-cpp-3.21.1.tgz
  if [ ! -s "$tgz" ]; then
    echo "== vocab: npm pack $PKG"
    (cd "$CACHE" && npm pack --silent "$PKG" >/dev/null)
  fi
  rm -rf "$CACHE/package" "$SRC"
  tar -xzf "$tgz" -C "$CACHE" package/llama/gitRelease.bundle
  # only models/ is checked out (the vectors); the rest of the tree stays in the object store
  git -c advice.detachedHead=false clone -q --no-checkout "$CACHE/package/llama/gitRelease.bundle" "$SRC"
  git -C "$SRC" -c advice.detachedHead=false checkout -q HEAD -- models
  rm -rf "$CACHE/package" "$tgz"
fi
got=$(git -C "$SRC" rev-parse HEAD)
if [ "$got" != "$COMMIT" ]; then
  echo "vocab: the bundle in $PKG is llama.cpp $got, not the pinned $COMMIT"
  exit 1
fi

fails=0
for v in "${CLAIMED[@]}" deepseek-llm bert-bge gemma-4; do
  f=$SRC/models/ggml-vocab-$v.gguf
  claimed=0
  for c in "${CLAIMED[@]}"; do [ "$c" = "$v" ] && claimed=1; done
  if [ ! -f "$f.inp" ] || [ "$(head -c 4 "$f")" != "GGUF" ]; then
    echo "vocab: $v: $f (.inp/.out) missing or not a GGUF file (a Git LFS pointer?)"
    fails=$((fails + claimed))
    continue
  fi
  mapfile -t want < <(sed 's/^ *//; s/ *$//' "$f.out")
  if ! "$KVP" tokenize --model "$f" --file "$f.inp" --chunks >"$CACHE/$v.ids" 2>"$CACHE/$v.err"; then
    echo "vocab: $v: 0/${#want[@]} ($(head -n 1 "$CACHE/$v.err" | cut -c 1-100))"
    fails=$((fails + claimed))
    continue
  fi
  mapfile -t have <"$CACHE/$v.ids"
  ok=0
  first=-1
  for i in "${!want[@]}"; do
    if [ "${want[$i]}" = "${have[$i]-}" ]; then
      ok=$((ok + 1))
    elif [ "$first" -lt 0 ]; then
      first=$i
    fi
  done
  [ "${#have[@]}" -ne "${#want[@]}" ] && [ "$first" -lt 0 ] && first=${#want[@]}
  echo "vocab: $v: $ok/${#want[@]} chunks equal$([ $claimed = 1 ] || echo ' (not claimed)')"
  if [ "$first" -ge 0 ] && [ $claimed = 1 ]; then
    echo "  chunk $first: llama.cpp '${want[$first]-}'"
    echo "  chunk $first: kvprune   '${have[$first]-}'"
    fails=$((fails + 1))
  fi
done
echo "vocab: $((${#CLAIMED[@]} - fails)) of ${#CLAIMED[@]} claimed vocabularies equal llama.cpp's ids ($(( $(date +%s) - t0 )) s)"
[ "$fails" -eq 0 ]
