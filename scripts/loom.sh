#!/usr/bin/env bash
# The loom models of the shared state (tests/loom/models.rs), then each deliberate mutation, which must
# make its model fail.
#
# The build is `RUSTFLAGS="--cfg surely_loom"` in its own target directory (target/loom), so that
# the normal build's cache stays valid: a change of RUSTFLAGS rebuilds every dependency. The
# mutations need no build of their own: each is a switch compiled into that same test binary and
# read from SURELY_LOOM_MUTATION when the process starts, so each run is one process with one
# switch on, running only the test that expects its counterexample.
#
# Each model's preemption bound is 3: loom explores every interleaving with at most 3 preemptions,
# which its authors find catches nearly every bug, and each step up multiplies the time. The
# build is the `loom` profile (release at opt-level 1): on this 2-core machine its build from an
# empty target/loom took 2 min 5 s against about 3 min 15 s for a release build, and the models
# ran in 14 s either way (each mutation under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg surely_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
unset SURELY_LOOM_MUTATION

echo "== loom models"
cargo test --profile loom -p surely-loom --test loom

# Each mutation and the tests that must find its counterexample.
mutations=(
  "breaker_no_generation_check mutation_breaker_no_generation_check"
  "breaker_probe_admit_racy mutation_breaker_probe_admit_racy"
  "breaker_probe_counted_twice mutation_breaker_probe_counted_twice"
  "ratio_no_recheck mutation_ratio_no_recheck mutation_ratio_no_recheck_with_deposit mutation_ratio_no_recheck_reserve mutation_ratio_no_recheck_batched"
  "token_bucket_lost_update mutation_token_bucket_lost_update"
  "store_acquire_split mutation_store_acquire_split"
  "store_no_fence mutation_store_no_fence"
  "store_finish_any_state mutation_store_finish_any_state"
)

# Every `mutation_*` test in the binary is run by one line above: a new one must be listed.
listed=$(printf '%s\n' "${mutations[@]}" | tr ' ' '\n' | grep '^mutation_' | sort)
present=$(cargo test -q --profile loom -p surely-loom --test loom -- --ignored --list 2>/dev/null \
  | sed -n 's/^\(mutation_[a-z_]*\): test$/\1/p' | sort)
if [ "$listed" != "$present" ]; then
  echo "error: the mutation tests in tests/loom/models.rs and the list in $0 differ:" >&2
  diff <(echo "$listed") <(echo "$present") >&2 || true
  exit 1
fi

for line in "${mutations[@]}"; do
  read -r name tests <<<"$line"
  for t in $tests; do
    echo "== mutation $name: $t must find its counterexample"
    SURELY_LOOM_MUTATION="$name" cargo test -q --profile loom -p surely-loom --test loom -- --ignored --exact "$t"
  done
done
echo "== loom: every model passed, and every mutation was caught"
