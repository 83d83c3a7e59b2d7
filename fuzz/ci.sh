#!/usr/bin/env bash
# Runs every cargo-fuzz target coverage-guided for a bounded time, each
# from a copy of its seed corpus (fuzz/corpus/<target>/), and fails on any
# crash, leak, out-of-memory or timeout (C-SD-5, C-T-6).
#
#   bash fuzz/ci.sh [SECONDS_PER_TARGET [TARGET...]]   # default 20 s, every target
#
# Needs a nightly toolchain (installed with rustup if missing; fails if it
# cannot be) and cargo-fuzz (installed, pinned, if missing). Prints a
# table: executions and executions per second per target. On a crash it
# prints the input as hex and the command that reproduces it; the input
# stays in the work directory it names. The tree is not written to.
#
# Environment:
#   FUZZ_BUILD_FLAGS  flags for `cargo fuzz build` and `run`
#                     (default: --sanitizer none, optimised, debug
#                     assertions and overflow checks on)
#   FUZZ_WORK         work directory (default: a new one under /tmp)
#   FUZZ_TOOLCHAIN    the nightly toolchain (default: nightly)
set -euo pipefail
cd "$(dirname "$0")"

SECS="${1:-20}"
case "$SECS" in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET [TARGET...]]" >&2; exit 2 ;;
esac
shift $(($# > 0 ? 1 : 0))
CARGO_FUZZ_VERSION=0.13.2
# Safe Rust leaves AddressSanitizer little to find, and it costs about half
# the executions and a slower build: the targets run without a sanitizer,
# with debug assertions and overflow checks (cargo-fuzz's default).
read -r -a FLAGS <<<"${FUZZ_BUILD_FLAGS:---sanitizer none}"
TC="${FUZZ_TOOLCHAIN:-nightly}"
WORK="${FUZZ_WORK:-$(mktemp -d /tmp/abhyasa-fuzz.XXXXXX)}"
mkdir -p "$WORK"

say() { printf '\n--> [%ss] %s\n' "$SECONDS" "$*"; }

say "toolchain $TC"
if ! cargo "+$TC" --version >/dev/null 2>&1; then
  echo "no $TC toolchain; installing it with rustup" >&2
  if ! rustup toolchain install "$TC" --profile minimal; then
    echo "error: cannot install the $TC toolchain (rustup failed above); the fuzz targets need a nightly compiler" >&2
    exit 1
  fi
fi
cargo "+$TC" --version

say "cargo-fuzz $CARGO_FUZZ_VERSION"
if [ "$(cargo fuzz --version 2>/dev/null | awk '{print $2}')" != "$CARGO_FUZZ_VERSION" ]; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi
cargo fuzz --version

say "build every target (cargo fuzz build ${FLAGS[*]})"
build_start=$SECONDS
cargo "+$TC" fuzz build "${FLAGS[@]}"
build_secs=$((SECONDS - build_start))
echo "built in ${build_secs}s"

mapfile -t ALL < <(cargo "+$TC" fuzz list)
[ "${#ALL[@]}" -gt 0 ] || { echo "error: no fuzz targets" >&2; exit 1; }
if [ "$#" -gt 0 ]; then
  TARGETS=("$@")
  for t in "${TARGETS[@]}"; do
    printf '%s\n' "${ALL[@]}" | grep -qx -- "$t" || { echo "error: no fuzz target $t (cargo fuzz list)" >&2; exit 2; }
  done
else
  TARGETS=("${ALL[@]}")
fi

failed=()
rows=()
for t in "${TARGETS[@]}"; do
  say "$t: ${SECS}s"
  corpus="$WORK/corpus/$t"
  artifacts="$WORK/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=0
  if [ -d "corpus/$t" ]; then
    cp -R "corpus/$t/." "$corpus/"
    seeds=$(find "corpus/$t" -type f | wc -l)
  else
    echo "no seed corpus (corpus/$t): starting from nothing"
  fi
  log="$WORK/$t.log"
  set +e
  cargo "+$TC" fuzz run "${FLAGS[@]}" "$t" "$corpus" -- \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
  units=$(find "$corpus" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    result="FAILED (exit $rc)"
    failed+=("$t")
    tail -n 40 "$log"
    found=0
    for input in "$artifacts"/*; do
      [ -f "$input" ] || continue
      found=1
      echo
      echo "input $input ($(wc -c <"$input") bytes), as hex:"
      od -An -v -tx1 "$input" | head -n 64
      echo "reproduce:  cd fuzz && cargo +$TC fuzz run ${FLAGS[*]} $t $input"
    done
    [ "$found" = 1 ] || echo "no input was written; the log is $log"
  fi
  rows+=("$(printf '%-20s %6s %12s %10s %8s  %s' "$t" "$seeds" "${execs:--}" "${rate:--}" "$units" "$result")")
done

say "summary (${SECS}s per target, build ${build_secs}s)"
printf '%-20s %6s %12s %10s %8s  %s\n' target seeds executions exec/s corpus result
printf '%s\n' "${rows[@]}"
echo "work directory: $WORK"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "error: fuzz targets failed: ${failed[*]} (see above: input as hex and how to reproduce)" >&2
  exit 1
fi
[ -n "${FUZZ_WORK:-}" ] || rm -rf "$WORK"
echo "fuzzing passed in ${SECONDS}s"
