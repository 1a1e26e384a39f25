#!/usr/bin/env bash
# What a user of the published crate builds, each in `target/published`, away from the main build
# (and its lock), so that `.ci/run` runs it in the background beside the tests:
#
# * the client alone (the default features), then each half alone, checked with warnings denied:
#   a user's build of the crate with these features would show them;
# * the docs of each of those builds, warnings denied: a link to an item behind a feature that is
#   off must lead to the crate's feature list (src/docs/links.rs), not be broken;
# * the crate as it would be published: `cargo package` builds it from the files the package
#   holds, so a file left out of it (a docs chapter, an admin template) fails here, not for a
#   user. With `admin` and `review`, whose templates and chain-file code are read at build time.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/published}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

check_clean() {
  local out
  out="$(cargo check --lib --no-default-features "$@" 2>&1)" || { echo "$out" >&2; return 1; }
  if grep -q '^warning' <<<"$out"; then
    echo "$out" >&2
    echo "error: cargo check --lib --no-default-features $* warns (above)" >&2
    return 1
  fi
}

echo "== cargo check: the client alone, then each half alone"
check_clean
check_clean --features server
check_clean --features durable
check_clean --features server,postgres

echo "== cargo doc: the client alone, then each half alone"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --no-default-features
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --no-default-features --features server
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --no-default-features --features durable

echo "== cargo package: the published files build"
cargo package --locked --features admin,review

echo "== the published crate: every feature set checked and documented, the package built"
