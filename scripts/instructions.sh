#!/usr/bin/env bash
# Instructions per call of surely's stacks and tower's, counted by valgrind's callgrind: unlike
# time, they repeat exactly for the same binary, whatever else the machine does. Each row runs
# two loops of one stack (`benches/instructions`: `--calls N --case GROUP/NAME`), of 1 000 and
# 11 000 calls; the difference of their counts over 10 000 is the cost of one call, the setup
# (the runtime, the stack's construction) cancelled out.
#
#   scripts/instructions.sh            prints each row's instructions per call
#   scripts/instructions.sh --check    and fails when a row of surely's is more than 2 % over
#                                      its baseline in benches/instructions.txt
#   scripts/instructions.sh --update   rewrites benches/instructions.txt: a baseline changes
#                                      only in a commit that says why
#
# Needs valgrind (`apt-get install -y valgrind`).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-print}"
baseline=benches/instructions.txt
case "$mode" in
  print|--check|--update) ;;
  *) echo "usage: scripts/instructions.sh [--check|--update]" >&2; exit 2 ;;
esac

command -v valgrind >/dev/null || { echo "error: valgrind is not installed" >&2; exit 1; }
# A release build of its own, in target/instructions, away from the main build (and its lock).
cargo build --release --locked --quiet -p surely-instructions --target-dir target/instructions
exe=target/instructions/release/surely-instructions
[ -x "$exe" ] || { echo "error: the instruction counts' crate did not build" >&2; exit 1; }
mapfile -t rows < <("$exe" --list)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

count() {  # count CASE CALLS: the instructions of one run
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$exe" --calls "$2" --case "$1" \
    2>"$out/log" >/dev/null
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/log"
}

: >"$out/now"
for row in "${rows[@]}"; do
  small="$(count "$row" 1000)"
  large="$(count "$row" 11000)"
  printf '%-45s %8d\n' "$row" $(( (large - small) / 10000 )) | tee -a "$out/now"
done

case "$mode" in
  --update)
    { echo "# Instructions per call (scripts/instructions.sh), on $(rustc --version)."
      cat "$out/now"; } >"$baseline"
    echo "rewrote $baseline" ;;
  --check)
    # A row of surely's (`GROUP/surely_…`) over 2 % above its baseline fails, as does a row
    # without a baseline. The references (`bare`, tower's stacks, the HTTP preset's `floor`) are
    # not surely's code: their drift is printed, not judged (tower's rows move by 2 to 3 % when
    # the binary around them changes, a row added elsewhere).
    awk 'NR == FNR { if ($1 !~ /^#/) base[$1] = $2; next }
         { if (!($1 in base)) { print "no baseline for " $1; bad = 1; next }
           if ($2 > base[$1] * 1.02) {
             guarded = ($1 ~ /\/surely_/)
             printf "%s: %d instructions a call, %d in the baseline (+%.1f %%)%s\n",
               $1, $2, base[$1], ($2 / base[$1] - 1) * 100, guarded ? "" : " (a reference: shown)"
             if (guarded) bad = 1 } }
         END { exit bad }' "$baseline" "$out/now" \
      || { echo "error: instructions per call of surely's rows grew past 2 % (see $baseline)" >&2; exit 1; }
    echo "instructions per call: every row of surely's within 2 % of $baseline" ;;
esac
