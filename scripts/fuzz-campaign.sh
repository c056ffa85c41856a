#!/usr/bin/env bash
# A libFuzzer campaign over gmig's untrusted-input decoders, without cargo-fuzz installed:
# builds the targets with the flags cargo-fuzz uses (AddressSanitizer, SanitizerCoverage), seeds
# each corpus with the valid inputs the CI smoke tests use (and the committed AUB captures), runs
# every target in fork mode for SECONDS, and prints each target's execution count and findings.
#
#   scripts/fuzz-campaign.sh [SECONDS [JOBS_PER_TARGET]]    (defaults: 300 s, 1 job)
#
# TARGETS="vgpu_resume stream_decode" runs only those targets (default: all five:
# vfio_user_session stream_decode aub_read vgpu_resume vgpu_guest).
# SANITIZER=none builds without AddressSanitizer (SanitizerCoverage, debug assertions and overflow
# checks stay): about 4 times the executions per second of `vgpu_resume`, for volume; the default,
# SANITIZER=address, is what finds memory errors in unsafe code.
#
# Each corpus starts from the committed one (fuzz/corpus/<target>) plus the smoke tests' seeds.
# With KEEP=1, what the campaign found is merged back into fuzz/corpus/<target> (libFuzzer's
# -merge=1 keeps only inputs that add coverage) for committing.
#
# FUZZ_ARGS="-ignore_crashes=1" adds libFuzzer flags to every target's run (with
# -ignore_crashes=1 fork mode goes on after a crash and saves every crashing input).
# MODE=jobs runs JOBS independent libFuzzer processes (-jobs/-workers) on the shared corpus
# instead of fork mode: a worker boots its vGPU once and fuzzes for the whole time, where fork
# mode restarts a process (and boots again) per job and merges serially in the parent; several
# times the executions a second for the vGPU targets, but a worker stops at its first crash.
#
# To run elsewhere (a machine without cargo): STAGE=DIR builds and seeds here, copies the
# binaries to DIR/bin and the corpora to DIR/corpus, and stops; PREBUILT=DIR on the other machine
# runs from there (no build, no seeding), writing logs and findings to DIR/out:
#   STAGE=target/fuzz-stage TARGETS=vgpu_guest SANITIZER=none scripts/fuzz-campaign.sh
#   PREBUILT=target/fuzz-stage TARGETS=vgpu_guest scripts/fuzz-campaign.sh 540 16
#
# Needs a nightly toolchain (`rustup toolchain install nightly`) or RUSTC_BOOTSTRAP=1 on stable,
# and a C++ compiler (libfuzzer-sys builds libFuzzer). Work goes to $CARGO_TARGET_DIR/fuzz-campaign/
# (default target/fuzz-campaign/): corpora in corpus/<target>, logs and crash/leak inputs in out/.
# See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-300}
JOBS=${2:-1}
read -r -a TARGETS <<<"${TARGETS:-vfio_user_session stream_decode aub_read vgpu_resume vgpu_guest}"
SANITIZER=${SANITIZER:-address}
WORK=${CARGO_TARGET_DIR:-$PWD/target}/fuzz-campaign
BUILD=$WORK/build
asan_flag=-Zsanitizer=address
case "$SANITIZER" in
    address) ;;
    none) BUILD=$WORK/build-none asan_flag= ;;
    *) echo "SANITIZER must be address or none" >&2; exit 2 ;;
esac
BIN=$BUILD/x86_64-unknown-linux-gnu/release
read -r -a more_args <<<"${FUZZ_ARGS:-}"

# Builds the targets with cargo-fuzz's flags and fills $WORK/corpus (the smoke tests' seeds, the
# committed corpora, the AUB fixtures); with STAGE set, copies binaries and corpora there.
build_and_seed() {
    mkdir -p "$WORK/out" "$WORK/corpus"

    toolchain=()
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        toolchain=(+nightly)
    else
        export RUSTC_BOOTSTRAP=1
    fi
    export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing $asan_flag \
    -Cdebug-assertions -Coverflow-checks -Cdebuginfo=0"
    bins=()
    for t in "${TARGETS[@]}"; do bins+=(--bin "$t"); done
    (cd fuzz && cargo "${toolchain[@]}" build --release --target x86_64-unknown-linux-gnu \
        --target-dir "$BUILD" "${bins[@]}")
    unset RUSTFLAGS RUSTC_BOOTSTRAP

    # Seeds: the smoke tests write their valid inputs; the AUB reader starts from the fixtures.
    GMIG_FUZZ_SEED_DIR="$WORK/corpus" cargo test -q -p gmig-test-support --test fuzz_smoke >/dev/null
    for t in "${TARGETS[@]}"; do
        mkdir -p "$WORK/corpus/$t"
        [ -d "fuzz/corpus/$t" ] && cp -n fuzz/corpus/"$t"/* "$WORK/corpus/$t/" 2>/dev/null || true
    done
    if [ -d "$WORK/corpus/aub_read" ]; then
        for d in fixtures/*/; do
            for f in "$d"*.aub; do cp "$f" "$WORK/corpus/aub_read/$(basename "$d")-$(basename "$f")"; done
        done
    fi
    if [ -n "${STAGE:-}" ]; then
        mkdir -p "$STAGE/bin" "$STAGE/corpus"
        for t in "${TARGETS[@]}"; do
            cp "$BIN/$t" "$STAGE/bin/"
            rm -rf "${STAGE:?}/corpus/$t"
            cp -r "$WORK/corpus/$t" "$STAGE/corpus/"
        done
        echo "staged ${TARGETS[*]} ($SANITIZER) in $STAGE: run there with PREBUILT=$STAGE"
        exit 0
    fi
}

if [ -n "${PREBUILT:-}" ]; then
    WORK=$(cd "$PREBUILT" && pwd)
    BIN=$WORK/bin
    mkdir -p "$WORK/out"
else
    build_and_seed
fi

# One hashing thread per process: rayon would otherwise start one per core in every job.
# (`vgpu_resume` boots its vGPU once per process, on its first input, and clones it for every
# other input: docs/fuzzing.md.)
export RAYON_NUM_THREADS=1
for t in "${TARGETS[@]}"; do
    extra=()
    asan=
    # rayon's worker threads keep crossbeam-epoch thread-locals alive at exit, which LeakSanitizer
    # reports as 64 leaked bytes: not a leak of gmig's (docs/fuzzing.md). -detect_leaks=0 alone
    # does not reach the children of -fork, which check at exit: ASAN_OPTIONS does.
    [ "$t" = vgpu_resume ] && extra=(-detect_leaks=0) && asan=detect_leaks=0
    [ "$t" = vfio_user_session ] && extra=(-max_len=4096)
    # vgpu_guest's recorded frames run to 4.5 KB; let inputs grow a little past them.
    [ "$t" = vgpu_guest ] && extra=(-max_len=8192)
    if [ "${MODE:-fork}" = jobs ]; then
        # Each worker logs to fuzz-<n>.log in its working directory.
        mkdir -p "$WORK/out/$t-jobs"
        (cd "$WORK/out/$t-jobs" && ASAN_OPTIONS=$asan "$BIN/$t" "$WORK/corpus/$t" \
            -jobs="$JOBS" -workers="$JOBS" \
            -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=3072 \
            -artifact_prefix="$WORK/out/$t-" "${extra[@]}" "${more_args[@]}" \
            >"$WORK/out/$t.log" 2>&1) &
    else
        ASAN_OPTIONS=$asan "$BIN/$t" "$WORK/corpus/$t" -fork="$JOBS" \
            -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=3072 \
            -artifact_prefix="$WORK/out/$t-" "${extra[@]}" "${more_args[@]}" \
            >"$WORK/out/$t.log" 2>&1 &
    fi
done
status=0
wait || status=$?

for t in "${TARGETS[@]}"; do
    # Fork mode prints "#N: cov: ..." status lines; a single job prints "#N ..." lines.
    if [ "${MODE:-fork}" = jobs ]; then
        # Each worker's last status line ("#N ...", or "Done N runs") is its execution count.
        runs=0
        for log in "$WORK/out/$t-jobs"/fuzz-*.log; do
            [ -e "$log" ] || continue
            n=$(grep -oE '^#[0-9]+|^Done [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
            runs=$((runs + ${n:-0}))
        done
    else
        runs=$(grep -oE '^#[0-9]+' "$WORK/out/$t.log" | tail -1 | tr -d '#')
    fi
    found=$(find "$WORK/out" -maxdepth 1 -type f -name "$t-*" ! -name "$t-merge.log" | wc -l)
    echo "$t: ${runs:-0} executions, $found crash/leak/timeout inputs, corpus $(ls "$WORK/corpus/$t" | wc -l) files"
done
if [ "${KEEP:-0}" = 1 ]; then
    for t in "${TARGETS[@]}"; do
        mkdir -p "fuzz/corpus/$t"
        "$BIN/$t" -merge=1 -detect_leaks=0 \
            "fuzz/corpus/$t" "$WORK/corpus/$t" >"$WORK/out/$t-merge.log" 2>&1 || status=1
        echo "$t: fuzz/corpus/$t now $(ls "fuzz/corpus/$t" | wc -l) files"
    done
fi
exit "$status"
