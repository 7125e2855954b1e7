//! Tidy checks over the workspace's Rust sources, as ordinary tests (the habit of
//! rust-analyzer's `xtask/src/tidy.rs`): file and function sizes, module cycles inside a crate,
//! a `//!` doc on every file. Each check prints every violation as `file:line: what`.
//!
//! The limits are the project's (ARCHITECTURE.md, "Tidy"): no `.rs` file over
//! [`MAX_FILE_LINES`] lines before its first `#[cfg(test)]`, no `fn` over [`MAX_FN_LINES`]
//! lines, no module cycle inside a crate but the allowed ones. The allow-lists below name
//! today's exceptions; an entry that no longer matches a violation fails the test too, so the
//! lists only shrink.
//!
//! Module granularity of the cycle check: a node is a module with its own file (`a/b.rs` and
//! `a/b/mod.rs` are `a::b`) of a library or binary crate (`src/` of each package; integration
//! tests, benches and examples are left out, as are `#[cfg(test)]` modules and the text after a
//! file's first `#[cfg(test)]`). An edge A → B is a path in A's code (`use` or inline) that
//! starts with `crate::`, `super::` or `self::` and names B, or an item of B (the longest
//! module prefix of the path). Edges from a module to one of its own ancestors are not
//! counted: a child module is part of its parent and reads the parent's shared items
//! (`use super::*`); the parent's edges to its children are. A cycle is a strongly connected
//! component of more than one module.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The most lines a source file may have before its first `#[cfg(test)]`.
const MAX_FILE_LINES: usize = 900;
/// The most lines a function may span, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 150;

/// Files over [`MAX_FILE_LINES`] today (workspace-relative paths).
const ALLOW_LONG_FILES: &[&str] = &["hw/src/lib.rs", "hw/src/probes.rs", "hw/src/rdma/verbs.rs"];

/// Functions over [`MAX_FN_LINES`] today: (file, function name).
const ALLOW_LONG_FNS: &[(&str, &str)] = &[
    ("hw/src/lib.rs", "prepare_local"),
    ("hw/src/low_latency/prepare.rs", "prepare"),
    ("hw/src/probes.rs", "memory_model_probes"),
    ("hw/src/probes.rs", "ll_send_chain_probe"),
    ("reports/src/report/ep_scaling.rs", "ep_scaling"),
    ("reports/src/report/published.rs", "vs_published"),
    ("reports/src/report/sweep.rs", "sweep_chart"),
];

/// Module cycles allowed: (crate, modules that may form a cycle among themselves).
///
/// The simulator core's is deliberate and stays: `Core` owns the machine's state (the packet
/// network, the GPUs' copy servers, the jobs' runtime) so that one event loop dispatches every
/// event without indirection, and those modules implement their part as methods on `Core`
/// (ARCHITECTURE.md, "Tidy").
const ALLOW_CYCLES: &[(&str, &[&str])] = &[
    ("eptwin-hw", &["rdma", "wire"]),
    ("eptwin-sim", &["core", "gpu", "jobs", "net", "net::nic"]),
];

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of the workspace (build output and hidden directories left out), sorted.
fn rust_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).expect("read a directory").flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(workspace_root(), &mut out);
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace_root()).unwrap_or(path).to_string_lossy().replace('\\', "/")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A report of violations: collects lines, then fails the test with all of them.
#[derive(Default)]
struct Violations {
    lines: Vec<String>,
}

impl Violations {
    fn push(&mut self, line: String) {
        self.lines.push(line);
    }

    /// Flags allow-list entries that matched nothing, then fails with every line.
    fn finish(mut self, what: &str, unused_allowances: Vec<String>) {
        for entry in unused_allowances {
            self.lines.push(format!(
                "tests/tidy.rs: allow-list entry {entry} matches no violation: remove it"
            ));
        }
        if !self.lines.is_empty() {
            panic!("{what}: {} violation(s)\n{}", self.lines.len(), self.lines.join("\n"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lexing: comments and literals blanked, so that braces, `fn` and paths are read from code only.
// ---------------------------------------------------------------------------------------------

/// The source with the contents of comments, string, byte-string, raw-string and char literals
/// replaced by spaces (newlines kept, so byte offsets and line numbers stay those of the file).
fn code_only(src: &str) -> Vec<u8> {
    let s = src.as_bytes();
    let mut out = s.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to.min(s.len())] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let ident_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let prev_ident = i > 0 && ident_char(s[i - 1]);
        if c == b'/' && s.get(i + 1) == Some(&b'/') {
            let end = s[i..].iter().position(|&b| b == b'\n').map_or(s.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c == b'/' && s.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == b'/' && s.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == b'*' && s.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !prev_ident && raw_string_start(s, i).is_some() {
            let (hashes, quote) = raw_string_start(s, i).unwrap();
            let mut j = quote + 1;
            loop {
                if j >= s.len() {
                    break;
                }
                if s[j] == b'"'
                    && s[j + 1..].iter().take(hashes).filter(|&&b| b == b'#').count() == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, quote + 1, j.saturating_sub(1 + hashes));
            i = j;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): a lifetime has no
            // closing quote right after its first character.
            if s.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < s.len() && s[j] != b'\'' {
                    j += 1;
                }
                blank(&mut out, i + 1, j);
                i = j + 1;
            } else if let Some(len) = char_literal_len(&s[i + 1..]) {
                blank(&mut out, i + 1, i + 1 + len);
                i += len + 2;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where a raw string starts at `i` (`r"`, `r#"`, `br#"`, `cr"`): its `#` count and the
/// offset of its opening quote.
fn raw_string_start(s: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if matches!(s.get(j), Some(b'b' | b'c')) {
        j += 1;
    }
    if s.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&b| b == b'#').count();
    (s.get(j + hashes) == Some(&b'"')).then_some((hashes, j + hashes))
}

/// The byte length of a one-character char literal's character when `rest` (after the
/// opening quote) is one, e.g. `x'` or `é'`.
fn char_literal_len(rest: &[u8]) -> Option<usize> {
    let first = *rest.first()?;
    let len = match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (rest.get(len) == Some(&b'\'')).then_some(len)
}

/// 1-based line of byte offset `at`.
fn line_of(code: &[u8], at: usize) -> usize {
    code[..at].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Identifier at `at`, if one starts there.
fn ident_at(code: &[u8], at: usize) -> Option<&str> {
    let first = *code.get(at)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let len = code[at..].iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_').count();
    std::str::from_utf8(&code[at..at + len]).ok()
}

fn skip_space(code: &[u8], mut at: usize) -> usize {
    while at < code.len() && code[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// Byte offset of the first `#[cfg(test)]` in the code, if any.
fn first_cfg_test(code: &[u8]) -> Option<usize> {
    let needle = b"#[cfg(test)]";
    code.windows(needle.len()).position(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------
// (a) File length, (d) the `//!` doc.
// ---------------------------------------------------------------------------------------------

#[test]
fn no_file_is_over_the_line_limit_before_its_tests() {
    let mut violations = Violations::default();
    let mut unused: BTreeSet<&str> = ALLOW_LONG_FILES.iter().copied().collect();
    for path in rust_files() {
        let rel = relative(&path);
        let src = read(&path);
        let code = code_only(&src);
        let lines = match first_cfg_test(&code) {
            Some(at) => line_of(&code, at) - 1,
            None => src.lines().count(),
        };
        if lines > MAX_FILE_LINES {
            let allowed = ALLOW_LONG_FILES.iter().find(|f| **f == rel);
            if let Some(entry) = allowed {
                unused.remove(entry);
            } else {
                violations.push(format!(
                    "{rel}:{}: {lines} lines before its tests (limit {MAX_FILE_LINES})",
                    MAX_FILE_LINES + 1
                ));
            }
        }
    }
    violations.finish("long files", unused.into_iter().map(|f| format!("\"{f}\"")).collect());
}

#[test]
fn every_file_starts_with_a_module_doc() {
    let mut violations = Violations::default();
    for path in rust_files() {
        let src = read(&path);
        // Inner attributes and plain comments may come first; the first item may not.
        let documented = src
            .lines()
            .map(str::trim)
            .take_while(|l| l.is_empty() || l.starts_with("//") || l.starts_with("#!["))
            .any(|l| l.starts_with("//!"));
        if !documented {
            violations.push(format!("{}:1: no `//!` module doc", relative(&path)));
        }
    }
    violations.finish("undocumented files", Vec::new());
}

// ---------------------------------------------------------------------------------------------
// (b) Function length.
// ---------------------------------------------------------------------------------------------

/// A function item: name, first line (of `fn`) and last line (its closing brace).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FnSpan {
    name: String,
    first_line: usize,
    last_line: usize,
}

impl FnSpan {
    fn lines(&self) -> usize {
        self.last_line - self.first_line + 1
    }
}

/// Every `fn` item with a body in the code (declarations ending in `;` and `fn(..)` pointer
/// types are not functions with a body).
fn functions(code: &[u8]) -> Vec<FnSpan> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 <= code.len() {
        let is_fn = &code[i..i + 2] == b"fn"
            && (i == 0 || !(code[i - 1].is_ascii_alphanumeric() || code[i - 1] == b'_'))
            && code.get(i + 2).is_some_and(|b| b.is_ascii_whitespace());
        if !is_fn {
            i += 1;
            continue;
        }
        let name_at = skip_space(code, i + 2);
        let Some(name) = ident_at(code, name_at) else {
            i += 2;
            continue;
        };
        // The signature ends at the first `{` (the body) or `;` outside parentheses/brackets.
        let (mut j, mut depth) = (name_at + name.len(), 0i32);
        while j < code.len() {
            match code[j] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b'{' | b';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if j >= code.len() || code[j] == b';' {
            i = j;
            continue;
        }
        let mut braces = 0i32;
        let mut k = j;
        while k < code.len() {
            match code[k] {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        out.push(FnSpan {
            name: name.to_string(),
            first_line: line_of(code, i),
            last_line: line_of(code, k.min(code.len() - 1)),
        });
        // Nested functions are measured too: continue inside the body.
        i = j + 1;
    }
    out
}

#[test]
fn no_function_is_over_the_line_limit() {
    let mut violations = Violations::default();
    let mut unused: BTreeSet<(&str, &str)> = ALLOW_LONG_FNS.iter().copied().collect();
    for path in rust_files() {
        let rel = relative(&path);
        let code = code_only(&read(&path));
        for f in functions(&code) {
            if f.lines() > MAX_FN_LINES {
                let allowed =
                    ALLOW_LONG_FNS.iter().find(|(file, name)| *file == rel && *name == f.name);
                if let Some(entry) = allowed {
                    unused.remove(entry);
                } else {
                    violations.push(format!(
                        "{rel}:{}: fn {} is {} lines (limit {MAX_FN_LINES})",
                        f.first_line,
                        f.name,
                        f.lines()
                    ));
                }
            }
        }
    }
    violations.finish(
        "long functions",
        unused.into_iter().map(|(f, n)| format!("(\"{f}\", \"{n}\")")).collect(),
    );
}

// ---------------------------------------------------------------------------------------------
// (c) Module cycles.
// ---------------------------------------------------------------------------------------------

/// A module path inside its crate; empty for the crate root.
type ModPath = Vec<String>;

fn show(m: &[String]) -> String {
    if m.is_empty() { "crate".to_string() } else { m.join("::") }
}

/// One library or binary crate: its name and its modules' files.
struct Crate {
    name: String,
    modules: BTreeMap<ModPath, PathBuf>,
}

/// The package directories of the workspace (those with a `Cargo.toml` and a `src/`).
fn crates() -> Vec<Crate> {
    let root = workspace_root();
    let mut dirs = vec![root.to_path_buf()];
    let mut entries: Vec<_> =
        std::fs::read_dir(root).unwrap().flatten().map(|e| e.path()).collect();
    entries.sort();
    dirs.extend(entries.into_iter().filter(|p| p.join("Cargo.toml").is_file()));
    let mut out = Vec::new();
    for dir in dirs {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let manifest = read(&dir.join("Cargo.toml"));
        let name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = ").map(|v| v.trim_matches('"').to_string()))
            .unwrap_or_else(|| relative(&dir));
        let mut modules = BTreeMap::new();
        for file in rust_files().into_iter().filter(|f| f.starts_with(&src)) {
            let rel = file.strip_prefix(&src).unwrap().with_extension("");
            let mut path: ModPath =
                rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if path.len() == 1 && (path[0] == "lib" || path[0] == "main") {
                path.clear();
            } else if path.last().is_some_and(|l| l == "mod") {
                path.pop();
            }
            if path.first().is_some_and(|p| p == "bin") {
                continue; // separate binaries: not modules of this crate
            }
            modules.insert(path, file);
        }
        modules.retain(|m, _| m.is_empty() || !is_test_module(m, &modules_files(&src, m)));
        out.push(Crate { name, modules });
    }
    out
}

/// The file that declares module `m` (its parent's file), for [`is_test_module`].
fn modules_files(src: &Path, m: &ModPath) -> Option<PathBuf> {
    let parent = &m[..m.len() - 1];
    let base = parent.iter().fold(src.to_path_buf(), |p, s| p.join(s));
    let candidates = if parent.is_empty() {
        vec![src.join("lib.rs"), src.join("main.rs")]
    } else {
        vec![base.with_extension("rs"), base.join("mod.rs")]
    };
    candidates.into_iter().find(|f| f.is_file())
}

/// Whether module `m` is declared under `#[cfg(test)]` in its parent (or the parent is a test
/// module itself).
fn is_test_module(m: &ModPath, parent_file: &Option<PathBuf>) -> bool {
    let Some(parent_file) = parent_file else { return false };
    let src = read(parent_file);
    let name = m.last().unwrap();
    let lines: Vec<&str> = src.lines().map(str::trim).collect();
    let decl = lines.iter().position(|l| {
        let l = l.trim_start_matches("pub ").trim_start_matches("pub(crate) ");
        l == format!("mod {name};")
    });
    let Some(decl) = decl else { return false };
    lines[..decl]
        .iter()
        .rev()
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .any(|l| *l == "#[cfg(test)]")
}

/// Paths in the code that start with `crate`, `super` or `self`, expanded out of `use`
/// groups: (offset of the path's start, segments including the leading keyword).
fn rooted_paths(code: &[u8]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let boundary = i == 0 || !(code[i - 1].is_ascii_alphanumeric() || code[i - 1] == b'_');
        let starts = boundary
            && ident_at(code, i).is_some_and(|w| matches!(w, "crate" | "super" | "self"))
            && code
                .get(i + ident_at(code, i).unwrap().len()..)
                .is_some_and(|r| r.starts_with(b"::"));
        if !starts {
            i += 1;
            continue;
        }
        // A `use` path might sit in a group whose prefix came before: `use a::{crate::...}` is
        // not valid Rust, so a rooted path is always the start of a path.
        let end = parse_path(code, i, Vec::new(), i, &mut out);
        i = end.max(i + 1);
    }
    out
}

/// Parses a path at `at` whose segments extend `prefix`; pushes each complete path (groups
/// expanded) to `out` and returns the offset after it.
fn parse_path(
    code: &[u8],
    mut at: usize,
    mut prefix: Vec<String>,
    start: usize,
    out: &mut Vec<(usize, Vec<String>)>,
) -> usize {
    loop {
        at = skip_space(code, at);
        if code.get(at) == Some(&b'{') {
            at += 1;
            loop {
                at = skip_space(code, at);
                match code.get(at) {
                    Some(b'}') => return at + 1,
                    Some(b',') => at += 1,
                    None => return at,
                    _ => {
                        let before = at;
                        at = parse_path(code, at, prefix.clone(), start, out);
                        if at == before {
                            at += 1;
                        }
                    }
                }
            }
        }
        match ident_at(code, at) {
            Some(w) => {
                at += w.len();
                prefix.push(w.to_string());
            }
            None => {
                if code.get(at) == Some(&b'*') {
                    at += 1;
                }
                break;
            }
        }
        let next = skip_space(code, at);
        if code[next..].starts_with(b"::") && !code[next + 2..].starts_with(b"<") {
            at = next + 2;
        } else {
            break;
        }
    }
    if !prefix.is_empty() {
        out.push((start, prefix));
    }
    at
}

/// The module a rooted path names: the longest prefix of its absolute form that is a module.
fn resolve(from: &ModPath, segments: &[String], modules: &BTreeMap<ModPath, PathBuf>) -> ModPath {
    let mut abs: ModPath = match segments[0].as_str() {
        "crate" => Vec::new(),
        _ => from.clone(),
    };
    let mut rest = &segments[1..];
    if segments[0] == "super" {
        abs.pop();
        while rest.first().is_some_and(|s| s == "super") {
            abs.pop();
            rest = &rest[1..];
        }
    }
    abs.extend(rest.iter().filter(|s| *s != "self").cloned());
    while !abs.is_empty() && !modules.contains_key(&abs) {
        abs.pop();
    }
    abs
}

/// Where a module depends on another: the first file:line of each edge.
type Edges = BTreeMap<ModPath, BTreeMap<ModPath, String>>;

fn module_edges(krate: &Crate) -> Edges {
    let mut edges: Edges = BTreeMap::new();
    for (m, file) in &krate.modules {
        let code = code_only(&read(file));
        let code = &code[..first_cfg_test(&code).unwrap_or(code.len())];
        let entry = edges.entry(m.clone()).or_default();
        for (at, segments) in rooted_paths(code) {
            let to = resolve(m, &segments, &krate.modules);
            let to_ancestor = to.len() <= m.len() && m[..to.len()] == to[..];
            if !to_ancestor {
                entry
                    .entry(to)
                    .or_insert_with(|| format!("{}:{}", relative(file), line_of(code, at)));
            }
        }
    }
    edges
}

/// Strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &Edges) -> Vec<Vec<ModPath>> {
    struct Tarjan<'a> {
        edges: &'a Edges,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flat_map(|e| e.keys()) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// The edges inside one component, each with where it is made.
fn describe_cycle(edges: &Edges, component: &[ModPath]) -> String {
    let mut text = String::new();
    for a in component {
        for (b, at) in edges.get(a).into_iter().flatten() {
            if component.contains(b) {
                let _ = write!(text, "\n    {at}: {} -> {}", show(a), show(b));
            }
        }
    }
    text
}

#[test]
fn no_module_cycle_inside_a_crate() {
    let mut violations = Violations::default();
    let mut unused: BTreeSet<(&str, Vec<&str>)> =
        ALLOW_CYCLES.iter().map(|(c, ms)| (*c, ms.to_vec())).collect();
    for krate in crates() {
        let edges = module_edges(&krate);
        for component in cycles(&edges) {
            let names: Vec<String> = component.iter().map(|m| show(m)).collect();
            let allowed = ALLOW_CYCLES
                .iter()
                .find(|(c, ms)| *c == krate.name && names.iter().all(|n| ms.contains(&n.as_str())));
            match allowed {
                Some((c, ms)) => {
                    unused.remove(&(*c, ms.to_vec()));
                }
                None => {
                    let first = edges[&component[0]]
                        .iter()
                        .find(|(b, _)| component.contains(b))
                        .map_or(String::new(), |(_, at)| at.clone());
                    violations.push(format!(
                        "{first}: crate {}: module cycle among {}{}",
                        krate.name,
                        names.join(", "),
                        describe_cycle(&edges, &component)
                    ));
                }
            }
        }
    }
    violations.finish(
        "module cycles",
        unused.into_iter().map(|(c, ms)| format!("(\"{c}\", {ms:?})")).collect(),
    );
}

// ---------------------------------------------------------------------------------------------
// The scanners' own tests.
// ---------------------------------------------------------------------------------------------

#[test]
fn code_only_blanks_comments_and_literals_but_keeps_lines() {
    let src = "fn a() { let s = \"}{\"; // } fn b() {\n let c = '}'; let r = r#\"{\"#; }\n/* { */ fn x<'a>(v: &'a str) {}\n";
    let code = String::from_utf8(code_only(src)).unwrap();
    assert_eq!(code.lines().count(), src.lines().count());
    assert!(!code.contains("fn b"));
    assert_eq!(code.matches('{').count(), 2, "{code}");
    assert!(code.contains("fn x<'a>(v: &'a str) {}"), "{code}");
}

#[test]
fn functions_are_measured_from_fn_to_their_closing_brace() {
    let src = "trait T {\n    fn decl(&self);\n}\nfn outer(f: fn(u32) -> u32) {\n    fn inner() {\n    }\n    let s = \"}\";\n}\n";
    let spans = functions(&code_only(src));
    let found: Vec<(&str, usize)> = spans.iter().map(|f| (f.name.as_str(), f.lines())).collect();
    assert_eq!(found, vec![("outer", 5), ("inner", 2)]);
}

#[test]
fn rooted_paths_expand_use_groups() {
    let src = "use crate::a::{b::C, d, self};\nlet x = super::e::f(1);\nuse self::g::*;\n";
    let paths: Vec<String> =
        rooted_paths(&code_only(src)).into_iter().map(|(_, p)| p.join("::")).collect();
    assert_eq!(
        paths,
        vec!["crate::a::b::C", "crate::a::d", "crate::a::self", "super::e::f", "self::g"]
    );
}

#[test]
fn cycles_are_found_and_ancestor_edges_ignored() {
    let m = |s: &str| -> ModPath {
        s.split("::").filter(|x| !x.is_empty()).map(String::from).collect()
    };
    let mut edges: Edges = BTreeMap::new();
    let mut add = |a: &str, b: &str| {
        edges.entry(m(a)).or_default().insert(m(b), String::new());
    };
    add("a", "b");
    add("b", "a");
    add("c", "d");
    add("d", "e");
    assert_eq!(cycles(&edges), vec![vec![m("a"), m("b")]]);
    let modules: BTreeMap<ModPath, PathBuf> =
        ["", "x", "x::y"].iter().map(|s| (m(s), PathBuf::new())).collect();
    assert_eq!(
        resolve(&m("x::y"), &[String::from("super"), String::from("Item")], &modules),
        m("x")
    );
    assert_eq!(
        resolve(&m("x"), &["crate".into(), "x".into(), "y".into(), "f".into()], &modules),
        m("x::y")
    );
}
