#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ with clang in build-fuzz (every library instrumented, ASan and
# UBSan on), writes their seed corpora, and runs them (docs/testing.md, "Fuzzing").
#
#   tools/fuzz.sh ci               every target for its fixed number of inputs, from the seeds alone
#                                  (tools/test.sh); prints the coverage reached, exits 1 on any finding
#   tools/fuzz.sh TARGET SECONDS   one target for SECONDS, its corpus kept in build-fuzz/corpus/TARGET
#   tools/fuzz.sh list             the targets
#
# TOUCHSTONE names the touchstone binary that writes the seed files (default: build/tools/touchstone).
# A finding's input is written to build-fuzz/findings/; rerun it with build-fuzz/fuzz/TARGET FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
touchstone=${TOUCHSTONE:-build/tools/touchstone}
python_target=fuzz_import_megatron_dump
python_golden=fuzz_golden_file  # the Python package's GoldenFile (fuzz/fuzz_golden_file.py)
# Inputs per target in `ci`: each takes about 30 s on 2 cores (docs/testing.md lists the rates).
declare -A ci_runs=([fuzz_h5_reader]=600 [fuzz_golden_reader]=600 [fuzz_checkpoint_file]=600
  [fuzz_safetensors]=100000 [fuzz_jsonl]=100000 [fuzz_config]=50000 [fuzz_ledger]=50000
  [fuzz_scaling_csv]=100000 [$python_target]=600 [$python_golden]=80
  [fuzz_plan_cli]=25000)
declare -A dictionary=([fuzz_h5_reader]=hdf5 [fuzz_golden_reader]=hdf5 [fuzz_checkpoint_file]=hdf5
  [fuzz_safetensors]=json [fuzz_jsonl]=json [fuzz_config]=json [fuzz_ledger]=json [fuzz_scaling_csv]=csv
  [fuzz_plan_cli]=plan)
targets=(fuzz_h5_reader fuzz_golden_reader fuzz_checkpoint_file fuzz_safetensors fuzz_jsonl fuzz_config
  fuzz_ledger fuzz_scaling_csv "$python_target" "$python_golden"
  fuzz_plan_cli)

usage() {
  sed -n '5,8p' "$0" | sed 's/^# //' >&2
  exit 2
}

build_targets() {
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOUCHSTONE_FUZZ=ON \
    -DTOUCHSTONE_CUDA=OFF > /dev/null
  cmake --build "$build" -j"$(nproc)" --target fuzzers
  [ -x "$touchstone" ] || { echo "fuzz.sh: $touchstone is not built (set TOUCHSTONE)" >&2; exit 2; }
  fuzz/make_seeds.sh "$touchstone" "$build/seeds"
}

# run_target TARGET CORPUS LIMIT...: one target on CORPUS (new inputs go there) and its seeds.
run_target() {
  local target=$1 corpus=$2
  shift 2
  mkdir -p "$corpus" "$build/findings"
  if [ "$target" = "$python_target" ] || [ "$target" = "$python_golden" ]; then
    TOUCHSTONE="$touchstone" /usr/bin/python3 "fuzz/$target.py" "$@" --findings "$build/findings/$target"
    return
  fi
  # A reader that needs more than a few hundred MB for an input of a few hundred KB, or a second for one
  # input, has a bug: libFuzzer reports either as a finding.
  "$build/fuzz/$target" -seed=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="fuzz/dicts/${dictionary[$target]}.dict" -artifact_prefix="$build/findings/$target-" "$@" \
    "$corpus" "$build/seeds/$target"
}

case "${1:-}" in
  list) printf '%s\n' "${targets[@]}" ;;
  ci)
    build_targets
    failed=()
    for target in "${targets[@]}"; do
      corpus="$build/ci-corpus/$target"
      rm -rf "$corpus"
      if [ "$target" = "$python_target" ] || [ "$target" = "$python_golden" ]; then limit=(--iterations "${ci_runs[$target]}"); else limit=(-runs="${ci_runs[$target]}"); fi
      start=$SECONDS
      if run_target "$target" "$corpus" "${limit[@]}" > "$build/$target.log" 2>&1; then
        # libFuzzer's last status line: inputs run, coverage (cov: edges, ft: features), corpus size.
        echo "$target: ok in $((SECONDS - start)) s: $(grep -E '^#[0-9]+[[:space:]]+DONE|no finding' "$build/$target.log" | tail -1)"
      else
        echo "$target: FINDING (log: $build/$target.log)"
        grep -E 'ERROR|finding|SUMMARY|Test unit written' "$build/$target.log" | head -20
        failed+=("$target")
      fi
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz.sh: findings in ${failed[*]}" >&2
      exit 1
    fi
    ;;
  *)
    [ $# -eq 2 ] && [[ -v "ci_runs[$1]" ]] || usage
    build_targets
    if [ "$1" = "$python_target" ] || [ "$1" = "$python_golden" ]; then limit=(--seconds "$2"); else limit=(-max_total_time="$2"); fi
    run_target "$1" "$build/corpus/$1" "${limit[@]}"
    ;;
esac
