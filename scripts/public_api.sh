#!/usr/bin/env bash
# The public API, listed: `public-api.txt` at the repository's root holds every public item of the
# library with every feature on, one line each, and `.ci/run` fails when the crate's surface
# differs from it, so that a change to the surface shows in review (the architecture chapter of
# the docs, "The surface is listed").
#
# Changing the public API on purpose? Run `scripts/public_api.sh --update` and commit
# `public-api.txt` with the change; the diff of the file is the change to the surface.
#
#   scripts/public_api.sh            regenerates the listing and diffs it against public-api.txt
#   scripts/public_api.sh --update   rewrites public-api.txt
#   scripts/public_api.sh --install  installs the pinned tool only (CI does it while its tests
#                                    run, which leave the cores idle much of the time)
#
# How: rustdoc writes the library's public items as JSON, and cargo-public-api lists them, one
# line per item, blanket implementations (`impl<T> From<T> for T` and the like) left out; the
# auto traits (`Send`, `Sync`, `Unpin`, the unwind-safety ones) stay, as losing one breaks
# users. rustdoc's JSON is unstable: this toolchain (stable) writes it when RUSTC_BOOTSTRAP=1
# lets it take `-Z unstable-options`, into a target directory of its own (`target/public-api`),
# because RUSTC_BOOTSTRAP makes the build scripts that probe for nightly features run again and
# the main build would start over. Each release of cargo-public-api reads one version of the
# JSON format: 0.52.0 reads version 57, Rust 1.95's. A new toolchain that writes another version
# needs the release that reads it (the one whose `rustdoc-types` dependency is at that version):
# the script stops and says so. The tool is installed by this script, pinned and `--locked`, the
# first time (about two minutes on two cores) into the machine's cache of tools
# (`$SURELY_TOOLS_DIR`, or `~/.cache/surely/tools`), so that every clone on the machine reuses
# it; one already on the PATH at that version (`cargo install --locked cargo-public-api@0.52.0`)
# is used instead.
set -euo pipefail
cd "$(dirname "$0")/.."

tool_version=0.52.0
format_version=57

update=false
install_only=false
case "${1:-}" in
  --update) update=true ;;
  --install) install_only=true ;;
  "") ;;
  *) echo "usage: scripts/public_api.sh [--update | --install]" >&2; exit 2 ;;
esac

target="${CARGO_TARGET_DIR:-target}"
tools="${SURELY_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/surely/tools}/cargo-public-api-$tool_version"
tool="$tools/bin/cargo-public-api"
is_pinned() { [ "$("$1" --version 2>/dev/null || true)" = "cargo-public-api $tool_version" ]; }
if ! is_pinned "$tool"; then
  if command -v cargo-public-api >/dev/null && is_pinned "$(command -v cargo-public-api)"; then
    # Installed by hand at the pinned version (`~/.cargo/bin`): used as it is.
    tool="$(command -v cargo-public-api)"
  else
    echo "installing cargo-public-api $tool_version into $tools" >&2
    # Built in a directory of cargo's own, not in the project's target directory.
    env -u CARGO_TARGET_DIR cargo install --locked --quiet --root "$tools" \
      --version "=$tool_version" cargo-public-api
  fi
fi

if $install_only; then
  echo "cargo-public-api $tool_version: $tool"
  exit 0
fi

json_target="$target/public-api"
RUSTC_BOOTSTRAP=1 cargo rustdoc --lib --all-features --quiet --target-dir "$json_target" \
  -- -Z unstable-options --output-format json
json="$json_target/doc/surely.json"
found="$({ grep -o '"format_version":[0-9]*' "$json" || true; } | tail -n 1 | cut -d: -f2)"
if [ "$found" != "$format_version" ]; then
  echo "error: rustdoc wrote its JSON in format version ${found:-unknown}; cargo-public-api" >&2
  echo "       $tool_version reads version $format_version. Pin the release that reads" >&2
  echo "       version ${found:-unknown} in scripts/public_api.sh (tool_version, format_version)." >&2
  exit 1
fi

listing="$json_target/public-api.txt"
"$tool" public-api --rustdoc-json "$json" --omit blanket-impls --color never >"$listing"

if $update; then
  cp "$listing" public-api.txt
  echo "public-api.txt: $(wc -l <public-api.txt) items"
  exit 0
fi
if ! diff -u --label public-api.txt --label 'the crate now' public-api.txt "$listing"; then
  echo >&2
  echo "error: the public API differs from public-api.txt (- lines are the file's, + the crate's)." >&2
  echo "       If the change is meant, run scripts/public_api.sh --update and commit public-api.txt." >&2
  exit 1
fi
echo "public-api.txt: the public API is as listed ($(wc -l <public-api.txt) items)"
