//! The crate's layering, checked: every top-level module of `src/` belongs to one layer, imports
//! only from its own layer or the layers below, and no two top-level modules import each other,
//! even through others.
//!
//! The layers are listed once, in the architecture chapter of the docs
//! (`src/docs/architecture.md`), as the block that follows its "The layers" heading; this test
//! reads them from there. An import is any path the code names (`use` or not) that starts at
//! `crate::`, at `super::` past the module's top, or at a name `lib.rs` re-exports; comments,
//! doc comments and string literals are not code.
//!
//! It also checks the chapter's "One shape for every layer": every `impl Layer for FooLayer` in
//! `src/` (the client's layers and the server's, but the documented exceptions) is in a
//! `layer.rs`, beside a `service.rs` with the service `Foo` and a `future.rs` with its
//! `ResponseFuture`, in a `pub mod future` that a user can name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every public error is `Send + Sync + 'static`, checked against `public-api.txt`.
mod errors;
/// The README's snippets and the quickstarts, compiled in a user's crate.
mod newcomer;

/// Modules that hold no code of their own: text included as documentation.
const TEXT_ONLY: &[&str] = &["docs"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layers, bottom first, each with its modules, read from the architecture chapter.
fn layers() -> Vec<(String, Vec<String>)> {
    let chapter = fs::read_to_string(root().join("src/docs/architecture.md"))
        .expect("src/docs/architecture.md is readable");
    let after = chapter
        .split_once("## The layers")
        .expect("the architecture chapter has a heading \"## The layers\"")
        .1;
    let block = after
        .split_once("```text\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a ```text block follows \"## The layers\"")
        .0;
    let mut layers: Vec<(usize, String, Vec<String>)> = Vec::new();
    for line in block.lines() {
        // `N  name  module module ...`; other lines (arrows, blank) are drawing.
        let mut words = line.split_whitespace();
        let Some(number) = words.next().and_then(|w| w.parse::<usize>().ok()) else {
            continue;
        };
        let name = words
            .next()
            .expect("a layer line names its layer")
            .to_owned();
        let modules = words.map(str::to_owned).collect::<Vec<_>>();
        assert!(!modules.is_empty(), "layer {name} lists no module");
        layers.push((number, name, modules));
    }
    layers.sort_by_key(|l| l.0);
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(
            l.0,
            i + 1,
            "the layers are numbered 1, 2, 3, ... from the bottom"
        );
    }
    layers.into_iter().map(|(_, n, m)| (n, m)).collect()
}

/// The source with comments and string and character literals blanked out, lines kept.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let keep_lines = |s: &[u8], out: &mut String| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = src[i..].find('\n').map_or(b.len(), |n| i + n);
            keep_lines(&b[i..end], &mut out);
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            keep_lines(&b[i..j], &mut out);
            i = j;
        } else if c == b'r'
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
            && !ident_before(b, i)
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let end = src[j + 1..]
                .find(&close)
                .map_or(b.len(), |n| j + 1 + n + close.len());
            keep_lines(&b[i..end], &mut out);
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            keep_lines(&b[i..(j + 1).min(b.len())], &mut out);
            i = j + 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                src[i + 2..].find('\'').map(|n| i + 2 + n + 1)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
            };
            match end {
                Some(end) => {
                    keep_lines(&b[i..end], &mut out);
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `.rs` file under `dir`, but those of `src/bin/`: each binary is a crate of its own,
/// above the library, and sees only its public API.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.ends_with("src/bin") {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/` (`src/retry/future.rs` is `["retry", "future"]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The names `lib.rs` re-exports, and the top-level module each comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let code = code_only(lib);
    let mut names = BTreeMap::new();
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(rest) = stmt
            .strip_prefix("pub use crate::")
            .or_else(|| stmt.strip_prefix("pub use self::"))
        else {
            continue;
        };
        let (module, items) = rest.split_once("::").unwrap_or((rest, ""));
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            let name = name.rsplit("::").next().unwrap_or(name);
            if !name.is_empty() {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// The top-level modules a file's code names, other than its own.
fn imports(code: &str, path: &[String], reexports: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let own = &path[0];
    let mut add = |name: &str| {
        let module = reexports.get(name).map_or(name, String::as_str);
        if module != own && module != "self" && module != "crate" && module != "super" {
            found.insert(module.to_owned());
        }
    };
    let text = code;
    let mut at = 0;
    loop {
        let next = [text[at..].find("crate::"), text[at..].find("super::")];
        let Some(n) = next.into_iter().flatten().min() else {
            break;
        };
        let start = at + n;
        at = start + 1;
        if start > 0 && text[..start].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        // Climb: `crate::` is the root; each `super::` is one module up.
        let mut depth = path.len();
        let mut rest = &text[start..];
        let mut from_root = false;
        loop {
            if let Some(r) = rest.strip_prefix("crate::") {
                from_root = true;
                rest = r;
                break;
            } else if let Some(r) = rest.strip_prefix("super::") {
                depth = depth.saturating_sub(1);
                rest = r;
            } else {
                break;
            }
        }
        if !from_root && depth > 0 {
            continue; // inside its own top-level module
        }
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, D}`: each item's first segment.
            let mut level = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => level += 1,
                    '}' if level == 0 => break,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        let first: String =
                            item.trim().chars().take_while(|c| is_ident(*c)).collect();
                        add(&first);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
            if !first.is_empty() {
                add(&first);
            }
        } else {
            let first: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !first.is_empty() {
                add(&first);
            }
        }
    }
    found
}

/// Edges between top-level modules: importer → imported, with the files that make each.
fn graph() -> BTreeMap<(String, String), BTreeSet<String>> {
    let src = root().join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs is readable");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src/").to_path_buf();
        let path = module_path(&rel);
        if path.is_empty() {
            continue; // lib.rs: the root declares and re-exports every module
        }
        let code = code_only(&fs::read_to_string(&file).expect("a source file is readable"));
        for to in imports(&code, &path, &reexports) {
            edges
                .entry((path[0].clone(), to))
                .or_default()
                .insert(rel.display().to_string());
        }
    }
    edges
}

/// The top-level modules `lib.rs` declares.
fn declared_modules() -> BTreeSet<String> {
    let lib = code_only(&fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs"));
    lib.split(';')
        .filter_map(|stmt| {
            let words: Vec<&str> = stmt.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "mod")?;
            (i + 2 == words.len()).then(|| words[i + 1].to_owned())
        })
        .collect()
}

#[test]
fn every_module_is_in_one_layer() {
    let mut seen = BTreeMap::new();
    for (layer, modules) in layers() {
        for m in modules {
            if let Some(other) = seen.insert(m.clone(), layer.clone()) {
                panic!("module {m} is listed in two layers: {other} and {layer}");
            }
        }
    }
    for m in declared_modules() {
        if TEXT_ONLY.contains(&m.as_str()) {
            continue;
        }
        assert!(
            seen.contains_key(&m),
            "module {m} is in src/lib.rs but in no layer of src/docs/architecture.md"
        );
    }
    for m in seen.keys() {
        assert!(
            declared_modules().contains(m),
            "the architecture chapter lists {m}, which src/lib.rs does not declare"
        );
    }
}

#[test]
fn no_import_runs_up_a_layer() {
    let mut level = BTreeMap::new();
    for (i, (layer, modules)) in layers().into_iter().enumerate() {
        for m in modules {
            level.insert(m, (i, layer.clone()));
        }
    }
    let mut up = Vec::new();
    for ((from, to), files) in graph() {
        let (Some(f), Some(t)) = (level.get(&from), level.get(&to)) else {
            continue; // every_module_is_in_one_layer names it
        };
        if t.0 > f.0 {
            up.push(format!(
                "{from} ({}) imports {to} ({}) in {}",
                f.1,
                t.1,
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    assert!(
        up.is_empty(),
        "imports that run up a layer:\n{}",
        up.join("\n")
    );
}

#[test]
fn no_cycle_between_top_level_modules() {
    let edges = graph();
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    // A module is on a cycle when it can reach itself; report each cycle's members once.
    let mut cycles: BTreeSet<Vec<String>> = BTreeSet::new();
    for start in next.keys() {
        let mut stack = vec![*start];
        let mut reached = BTreeSet::new();
        while let Some(m) = stack.pop() {
            for n in next.get(m).into_iter().flatten() {
                if reached.insert(*n) {
                    stack.push(n);
                }
            }
        }
        if reached.contains(start) {
            let mut members: Vec<String> = reached
                .iter()
                .filter(|m| reaches(&next, m, start))
                .map(|m| m.to_string())
                .collect();
            members.sort();
            cycles.insert(members);
        }
    }
    let described: Vec<String> = cycles
        .iter()
        .map(|members| {
            let inside: Vec<String> = edges
                .iter()
                .filter(|((f, t), _)| members.contains(f) && members.contains(t))
                .map(|((f, t), files)| {
                    format!(
                        "  {f} -> {t} ({})",
                        files.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            format!("{}:\n{}", members.join(", "), inside.join("\n"))
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules:\n{}",
        described.join("\n")
    );
}

fn reaches(next: &BTreeMap<&str, Vec<&str>>, from: &str, to: &str) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(m) = stack.pop() {
        if m == to {
            return true;
        }
        for n in next.get(m).into_iter().flatten() {
            if seen.insert(*n) {
                stack.push(n);
            }
        }
    }
    false
}

/// The reader itself: comments and strings are not imports, `super::` past the top is, and a
/// root re-export counts as its module.
#[test]
fn the_reader_reads_imports() {
    let reexports = BTreeMap::from([("Error".to_owned(), "error".to_owned())]);
    let path = vec!["retry".to_owned(), "future".to_owned()];
    let code = code_only(
        "use crate::{classify::X, Error};\n// crate::ledger\n/// [a](crate::outbox)\n\
         let s = \"crate::inbox\"; let c = '\"'; fn f<'a>(x: &'a u8) {}\n\
         use super::super::hedge::Y; use super::layer::Z; crate::deadline::current();",
    );
    let found = imports(&code, &path, &reexports);
    let want: BTreeSet<String> = ["classify", "error", "hedge", "deadline"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(found, want);
}

// ---- one shape for every layer ------------------------------------------------------------

/// The types that implement `tower::Layer` and are not layers in the one-shape sense: the
/// client stack as one layer, whose service is the assembled stack. The architecture chapter's
/// section "One shape for every layer" names each; `the_exceptions_are_documented` checks it.
const SHAPE_EXCEPTIONS: &[&str] = &["ClientLayer"];

/// The text of the architecture chapter's section "One shape for every layer".
fn shape_section() -> String {
    let chapter = fs::read_to_string(root().join("src/docs/architecture.md"))
        .expect("src/docs/architecture.md is readable");
    let after = chapter
        .split_once("## One shape for every layer")
        .expect("the architecture chapter has a heading \"## One shape for every layer\"")
        .1;
    after.split("\n## ").next().unwrap_or(after).to_owned()
}

/// `s[at..]` past a balanced `<...>` that starts at `at` (a `->` inside is not a closer).
fn skip_angles(s: &str, at: usize) -> usize {
    let b = s.as_bytes();
    let mut depth = 0;
    let mut i = at;
    while i < b.len() {
        match b[i] {
            b'<' => depth += 1,
            b'>' if i > 0 && b[i - 1] == b'-' => {}
            b'>' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// `s[at..]` past a balanced `{...}` that starts at `at`.
fn skip_braces(s: &str, at: usize) -> usize {
    let b = s.as_bytes();
    let mut depth = 0;
    for (i, c) in b.iter().enumerate().skip(at) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

fn skip_ws(s: &str, at: usize) -> usize {
    at + (s[at..].len() - s[at..].trim_start().len())
}

/// A path's segments from `at` (`tower_layer::Layer`, `Service`), and where it ends.
fn read_path(s: &str, at: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    let mut i = skip_ws(s, at);
    loop {
        let ident: String = s[i..].chars().take_while(|c| is_ident(*c)).collect();
        if ident.is_empty() {
            break;
        }
        i += ident.len();
        segments.push(ident);
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    (segments, i)
}

/// An `impl<..> Trait<..> for Type<..> { .. }` of a trait whose last segment is `trait_name`:
/// the type's name and the block's body.
struct TraitImpl {
    ty: String,
    body: String,
}

fn impls_of(code: &str, trait_name: &str) -> Vec<TraitImpl> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("impl") {
        let start = from + n;
        from = start + 4;
        let before_ok = start == 0 || !code[..start].chars().next_back().is_some_and(is_ident);
        let after_ok = !code[start + 4..].chars().next().is_some_and(is_ident);
        if !before_ok || !after_ok {
            continue;
        }
        let mut i = skip_ws(code, start + 4);
        if code[i..].starts_with('<') {
            i = skip_angles(code, i);
        }
        let (path, end) = read_path(code, i);
        if path.last().map(String::as_str) != Some(trait_name) {
            continue;
        }
        let mut i = skip_ws(code, end);
        if code[i..].starts_with('<') {
            i = skip_angles(code, i);
        }
        i = skip_ws(code, i);
        let Some(rest) = code[i..].strip_prefix("for") else {
            continue;
        };
        let (ty, end) = read_path(code, code.len() - rest.len());
        let Some(ty) = ty.last().cloned() else {
            continue;
        };
        let Some(open) = code[end..].find('{').map(|n| end + n) else {
            continue;
        };
        let close = skip_braces(code, open);
        found.push(TraitImpl {
            ty,
            body: code[open..close].to_owned(),
        });
    }
    found
}

/// The type an impl's body gives an associated type: `type Service = Foo<S>;` is `Foo`, and
/// `type Future = future::ResponseFuture<..>` is `future::ResponseFuture`.
fn associated(body: &str, name: &str) -> Option<Vec<String>> {
    let at = body.find(&format!("type {name}"))?;
    let eq = at + body[at..].find('=')?;
    let (path, _) = read_path(body, eq + 1);
    (!path.is_empty()).then_some(path)
}

/// Whether `code` has a struct named `name` that is public.
fn has_pub_struct(code: &str, name: &str) -> bool {
    code.match_indices(&format!("pub struct {name}"))
        .any(|(i, m)| !code[i + m.len()..].chars().next().is_some_and(is_ident))
}

/// Whether `code` declares `pub mod name;`.
fn has_pub_mod(code: &str, name: &str) -> bool {
    code.split(';').any(|stmt| {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        words.ends_with(&["pub", "mod", name])
    })
}

/// What is wrong with the shape of the layer `imp` found in `file`, if anything.
fn shape_faults(file: &Path, imp: &TraitImpl) -> Vec<String> {
    let src = root().join("src");
    let rel = file
        .strip_prefix(&src)
        .unwrap_or(file)
        .display()
        .to_string();
    let layer = &imp.ty;
    let mut faults = Vec::new();
    let mut fault = |why: String| faults.push(format!("{layer} ({rel}): {why}"));
    if file.file_name().is_none_or(|n| n != "layer.rs") {
        fault("a layer lives in a `layer.rs`".into());
    }
    let Some(service) = layer.strip_suffix("Layer").filter(|s| !s.is_empty()) else {
        fault("a layer's name ends in `Layer`".into());
        return faults;
    };
    match associated(&imp.body, "Service").and_then(|p| p.last().cloned()) {
        Some(s) if s == service => {}
        Some(s) => fault(format!("its service is `{s}`, not `{service}`")),
        None => fault("no `type Service` found".into()),
    }
    let dir = file.parent().expect("a file has a folder");
    let service_rs = code_only(&fs::read_to_string(dir.join("service.rs")).unwrap_or_default());
    if !has_pub_struct(&service_rs, service) {
        fault(format!(
            "`pub struct {service}` is not in the sibling `service.rs`"
        ));
    }
    let services: Vec<TraitImpl> = impls_of(&service_rs, "Service")
        .into_iter()
        .filter(|i| i.ty == service)
        .collect();
    if services.is_empty() {
        fault(format!(
            "no `impl Service for {service}` in the sibling `service.rs`"
        ));
    }
    let imports_future = service_rs.contains("super::future::");
    for s in &services {
        match associated(&s.body, "Future") {
            Some(p) if p.last().map(String::as_str) == Some("ResponseFuture") => {
                let qualified = p.len() >= 2 && p[p.len() - 2] == "future";
                if !qualified && !imports_future {
                    fault("its service's `ResponseFuture` is not the sibling `future.rs`'s".into());
                }
            }
            Some(p) => fault(format!(
                "its service's future is `{}`, not `future::ResponseFuture`",
                p.join("::")
            )),
            None => fault("its service has no `type Future`".into()),
        }
    }
    let future_rs = code_only(&fs::read_to_string(dir.join("future.rs")).unwrap_or_default());
    if !has_pub_struct(&future_rs, "ResponseFuture") {
        fault("`pub struct ResponseFuture` is not in the sibling `future.rs`".into());
    }
    let mod_rs = code_only(&fs::read_to_string(dir.join("mod.rs")).unwrap_or_default());
    if !has_pub_mod(&mod_rs, "future") {
        fault("its folder's `mod.rs` does not declare `pub mod future;`".into());
    }
    // The future is nameable: every folder from `src/` down to the layer's is a `pub mod`.
    let mut parent = src.clone();
    for part in dir
        .strip_prefix(&src)
        .map(|p| p.to_path_buf())
        .unwrap_or_default()
        .iter()
    {
        let name = part.to_string_lossy();
        let parent_file = if parent == src {
            parent.join("lib.rs")
        } else {
            parent.join("mod.rs")
        };
        let code = code_only(&fs::read_to_string(&parent_file).unwrap_or_default());
        if !has_pub_mod(&code, &name) {
            fault(format!(
                "`{name}` is not a `pub mod` of {}",
                parent_file.display()
            ));
        }
        parent = parent.join(part);
    }
    faults
}

/// Every type in `src/` that implements `tower::Layer`, with its file.
fn layers_in_src() -> Vec<(PathBuf, TraitImpl)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let code = code_only(&fs::read_to_string(&file).expect("a source file is readable"));
        for imp in impls_of(&code, "Layer") {
            found.push((file.clone(), imp));
        }
    }
    found
}

/// The one-shape rule of the architecture chapter, for every layer in `src/` (the client's and
/// the server's): `FooLayer` in a `layer.rs`, its service `Foo` in the sibling `service.rs`,
/// whose future is the `ResponseFuture` of the sibling `future.rs`, a `pub mod future` nameable
/// from the crate's root.
#[test]
fn every_layer_has_the_one_shape() {
    let layers = layers_in_src();
    let names: BTreeSet<&str> = layers.iter().map(|(_, i)| i.ty.as_str()).collect();
    // The reader found the layers (a reader that finds none would pass anything).
    for known in [
        "RetryLayer",
        "SetDeadlineLayer",
        "HedgeLayer",
        "ClientLayer",
    ] {
        assert!(
            names.contains(known),
            "no `impl Layer for {known}` found in src/"
        );
    }
    let faults: Vec<String> = layers
        .iter()
        .filter(|(_, imp)| !SHAPE_EXCEPTIONS.contains(&imp.ty.as_str()))
        .flat_map(|(file, imp)| shape_faults(file, imp))
        .collect();
    assert!(
        faults.is_empty(),
        "layers out of shape (docs::architecture, \"One shape for every layer\"):\n{}",
        faults.join("\n")
    );
}

#[test]
fn the_exceptions_are_documented() {
    let section = shape_section();
    for name in SHAPE_EXCEPTIONS {
        assert!(
            section.contains(name),
            "{name} is an exception to the one shape, but the chapter's section does not name it"
        );
    }
}

/// The reader of the shape: impls with generics, paths, `->` in bounds, and a layer out of
/// shape said so.
#[test]
fn the_reader_reads_layers() {
    let code = code_only(
        "impl<S, F: Fn(&u8) -> Option<u8>> tower_layer::Layer<S> for FooLayer<F> {\n\
         type Service = Foo<S, F>; fn layer(&self, s: S) -> Foo<S, F> { todo!() } }\n\
         impl<S> Service<Req> for Foo<S> { type Future = future::ResponseFuture<S::Future>; }\n\
         // impl Layer<S> for CommentLayer {}\n",
    );
    let layers = impls_of(&code, "Layer");
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0].ty, "FooLayer");
    assert_eq!(
        associated(&layers[0].body, "Service"),
        Some(vec!["Foo".to_owned()])
    );
    let services = impls_of(&code, "Service");
    assert_eq!(services[0].ty, "Foo");
    assert_eq!(
        associated(&services[0].body, "Future"),
        Some(vec!["future".to_owned(), "ResponseFuture".to_owned()])
    );
    // A layer in a file that is not `layer.rs`, beside no service or future, is out of shape.
    let faults = shape_faults(&root().join("src/nowhere/mod.rs"), &layers[0]);
    assert!(
        faults.iter().any(|f| f.contains("`layer.rs`")),
        "{faults:?}"
    );
    assert!(
        faults.iter().any(|f| f.contains("service.rs")),
        "{faults:?}"
    );
}

/// The README's links work where it is published (the registry's page, docs.rs): each is a
/// full address or an anchor of the page, never a path of the repository.
#[test]
fn the_readmes_links_work_where_it_is_published() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let relative: Vec<&str> = readme
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.starts_with("https://") && !target.starts_with('#'))
        .collect();
    assert!(
        relative.is_empty(),
        "links that break on the registry's page: {relative:?}"
    );
}

/// The tests build at most eight binaries (each one links the crate and its dependencies
/// again): a new suite goes into one of them as a module, not beside them.
#[test]
fn the_tests_are_at_most_eight_binaries() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut binaries: Vec<String> = std::fs::read_dir(&tests)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name()?.to_str()?.to_owned();
            let is_binary = if path.is_dir() {
                path.join("main.rs").exists()
            } else {
                name.ends_with(".rs")
            };
            is_binary.then_some(name)
        })
        .collect();
    binaries.sort();
    assert!(
        binaries.len() <= 8,
        "{} test binaries, over 8: {binaries:?}",
        binaries.len()
    );
}

/// The README is the front door: at most 150 lines, with the depth in the docs chapters.
#[test]
fn the_readme_fits_on_a_page() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines, over 150: move depth to src/docs"
    );
}
