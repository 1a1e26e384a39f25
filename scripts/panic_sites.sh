#!/usr/bin/env bash
# Counts the places in the library (not its tests) where a panic can start: clippy's restriction
# lints for `unwrap`, `expect`, `panic!`, `unreachable!`, indexing and slicing, unchecked
# arithmetic (integer and time: `Instant + Duration` is one) and unchecked `Instant - Duration`.
# Each place is a line to read, not a bug: most indexing is bounded by a check above it, and most
# integer arithmetic is on counters. The time arithmetic is the part that must reach zero: a
# duration that a caller, a configuration file or a peer supplies must never panic (the
# architecture chapter of the docs, "Durations").
#
#   scripts/panic_sites.sh            the counts, by lint, and the lines of time arithmetic left
#   scripts/panic_sites.sh --all      every place, one line each
set -euo pipefail
cd "$(dirname "$0")/.."

lints=(
  -W clippy::unwrap_used -W clippy::expect_used -W clippy::panic -W clippy::unreachable
  -W clippy::todo -W clippy::unimplemented -W clippy::indexing_slicing
  -W clippy::arithmetic_side_effects -W clippy::unchecked_time_subtraction
)
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
# `touch` makes clippy look at the crate again even when its last build is cached.
touch src/lib.rs
cargo clippy --lib --all-features --message-format=short -- -A clippy::all "${lints[@]}" 2>&1 |
  grep -E '^src/.*: warning: ' | sort -u >"$out" || true

if [ "${1:-}" = "--all" ]; then
  cat "$out"
  exit 0
fi

echo "panic sites in src/ (library code): $(wc -l <"$out")"
sed -E 's/^[^ ]+ warning: //; s/: help: .*//' "$out" | sort | uniq -c | sort -rn
# Arithmetic on a line that names a time type, a clock or a time-like variable (a counter's `+= 1`
# aside): the sums and differences of instants and durations.
time_lines="$(grep -E 'arithmetic operation|unchecked subtraction of a .Duration' "$out" |
  while IFS=: read -r file line _; do
    text="$(sed -n "${line}p" "$file")"
    if printf '%s' "$text" |
      grep -qwE 'Instant|Duration|now|until|deadline|lease|after|hold|held|since|started|every|wait|timeout|retry_after' &&
      ! printf '%s' "$text" | grep -qE '[+-]= 1;'; then
      printf '%s:%s: %s\n' "$file" "$line" "$(printf '%s' "$text" | sed -E 's/^ +//')"
    fi
  done)"
echo "time arithmetic among them: $(printf '%s' "$time_lines" | grep -c . || true)"
printf '%s\n' "$time_lines" | grep . || true
