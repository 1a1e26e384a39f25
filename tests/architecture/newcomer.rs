//! The newcomer's test: the README's snippets and each quickstart example, compiled as a user's
//! crate compiles them. Outside this crate, depending on it by path, each with only the features
//! the README names for it: a snippet those of the ```` ```toml ```` line above it, a quickstart
//! those of its `cargo run` line. The doctests and `cargo run --example` compile them inside
//! this crate, where the dev-dependencies turn on more features than a user's crate has.
//!
//! The crate is made under the test's temporary directory (`target/tmp/newcomer`), with this
//! crate's `Cargo.lock` so that it resolves the same versions, and checked (`cargo check`) once
//! per set of features.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use super::root;

/// The examples a user copies: one file each (and the support files they name), on the public
/// API and the crates a user adds.
const QUICKSTARTS: &[&str] = &[
    "hyper_client",
    "tonic_client",
    "reqwest_client",
    "reqwest_middleware",
    "axum_server",
];

/// What a user adds beside surely, for the README's snippets and the quickstarts.
const USER_DEPENDENCIES: &str = r#"
tokio = { version = "1.40", features = ["full"] }
tower = { version = "0.5.2", features = ["full"] }
http = "1.1"
bytes = "1"
http-body-util = "0.1.2"
hyper = { version = "1.4", features = ["full"] }
hyper-util = { version = "0.1.10", features = ["full"] }
axum = "0.8"
reqwest = { version = "0.13.5", default-features = false, features = ["json"] }
reqwest-middleware = { version = "0.5.2", features = ["json"] }
tonic = { version = "0.14", default-features = false, features = ["channel", "server", "router"] }
async-trait = "0.1.51"
"#;

/// A program of the newcomer's crate: its name, its source, and the surely features it names.
struct Program {
    name: String,
    source: String,
    features: Vec<String>,
}

/// The README's Rust snippets, each with the features of the ```` ```toml ```` block before it,
/// as a user's program: rustdoc's hidden lines (`# `) shown.
fn readme_programs(readme: &str) -> Vec<Program> {
    let mut programs = Vec::new();
    let mut features: Option<Vec<String>> = None;
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let fence = line.trim();
        if fence != "```toml" && fence != "```rust" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        if fence == "```toml" {
            features = block
                .iter()
                .find(|l| l.starts_with("surely = "))
                .map(|l| features_of_toml(l));
            continue;
        }
        let n = programs.len() + 1;
        let features = features.take().unwrap_or_else(|| {
            panic!("README: Rust snippet {n} has no ```toml line before it that names surely's features")
        });
        let source: Vec<&str> = block
            .iter()
            .map(|l| match l.trim_start() {
                "#" => "",
                t if t.starts_with("# ") => &t[2..],
                _ => l,
            })
            .collect();
        let mut source = source.join("\n");
        if !source.contains("fn main") {
            source = format!("fn main() {{\n{source}\n}}");
        }
        programs.push(Program {
            name: format!("readme_{n}"),
            source,
            features,
        });
    }
    programs
}

/// `["a", "b"]` of `surely = { version = "0.1", features = ["a", "b"] }`.
fn features_of_toml(line: &str) -> Vec<String> {
    let list = line
        .split("features = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("");
    list.split(',')
        .map(|f| f.trim().trim_matches('"').to_owned())
        .filter(|f| !f.is_empty())
        .collect()
}

/// The features of the README's `cargo run ... --example <name>` line.
fn quickstart_features(readme: &str, name: &str) -> Vec<String> {
    let needle = format!("--example {name}`");
    let line = readme
        .lines()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("README: no `cargo run ... --example {name}` line"));
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.iter().position(|w| *w == "--features") {
        Some(i) => words[i + 1].split(',').map(str::to_owned).collect(),
        None => Vec::new(),
    }
}

#[test]
fn the_readme_and_the_quickstarts_compile_in_a_users_crate() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md is readable");
    let mut programs = readme_programs(&readme);
    assert!(
        programs.len() >= 3,
        "the README's client, SDK and server snippets"
    );
    for name in QUICKSTARTS {
        let source = fs::read_to_string(root.join("examples").join(format!("{name}.rs")))
            .expect("the quickstart is one file");
        programs.push(Program {
            name: (*name).to_owned(),
            source,
            features: quickstart_features(&readme, name),
        });
    }

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("newcomer");
    let _ = fs::remove_dir_all(dir.join("src"));
    fs::create_dir_all(dir.join("src/bin/support")).unwrap();
    // A support file a quickstart names by path (tonic's codec without protoc).
    fs::copy(
        root.join("examples/support/raw_codec.rs"),
        dir.join("src/bin/support/raw_codec.rs"),
    )
    .unwrap();

    // One feature of the newcomer's per set of surely features, which its programs require.
    let mut sets: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut bins = String::new();
    for p in &programs {
        let mut set = p.features.clone();
        set.sort();
        let n = sets.len();
        let feature = sets.entry(set).or_insert_with(|| format!("set{n}")).clone();
        fs::write(dir.join(format!("src/bin/{}.rs", p.name)), &p.source).unwrap();
        bins.push_str(&format!(
            "\n[[bin]]\nname = \"{}\"\npath = \"src/bin/{}.rs\"\nrequired-features = [\"{feature}\"]\n",
            p.name, p.name
        ));
    }
    let features: String = sets
        .iter()
        .map(|(set, feature)| {
            let list: Vec<String> = set.iter().map(|f| format!("\"surely/{f}\"")).collect();
            format!("{feature} = [{}]\n", list.join(", "))
        })
        .collect();
    let manifest = format!(
        "[package]\nname = \"newcomer\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\
         autobins = false\n\n[workspace]\n\n[features]\n{features}\n[dependencies]\n\
         surely = {{ path = {:?}, default-features = false }}\n{USER_DEPENDENCIES}{bins}",
        root.display().to_string()
    );
    fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

    let mut failed = Vec::new();
    for (set, feature) in &sets {
        let out = Command::new(env!("CARGO"))
            .current_dir(&dir)
            .args(["check", "--quiet", "--bins", "--features", feature])
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo runs");
        if !out.status.success() {
            let names: Vec<&str> = programs
                .iter()
                .filter(|p| {
                    let mut f = p.features.clone();
                    f.sort();
                    &f == set
                })
                .map(|p| p.name.as_str())
                .collect();
            failed.push(format!(
                "{names:?} with surely's features {set:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "in a user's crate ({}), these do not compile:\n{}",
        dir.display(),
        failed.join("\n")
    );
}
