//! The analyzer's modules import each other without cycles, except the ones listed in
//! [`ALLOWED_CYCLES`], each of which must still exist as listed: a cycle that closes fails the
//! test, and so does one that grows or opens without the list being brought up to date.
//!
//! A module is one file of `analyzer/src` (`a/b.rs` and `a/b/mod.rs` are `a::b`). Module `a`
//! imports module `b` when its code (comments and string literals left out) names a path
//! `crate::b::...`, `super::...`, `self::...` or, for a module `b` it declares (`mod b;`), `b::...`
//! that resolves to `b`, in a `use` or in an expression; a path resolves to the longest module it
//! starts with. The declarations `mod b;` are not imports: a parent that names its child's items
//! (a re-export) imports it, and the child then may not import the parent.
//! Run with `--nocapture` to see the cycles left.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The import cycles still present, as the sets of modules in each (strongly connected
/// component). Remove an entry when its cycle is opened.
const ALLOWED_CYCLES: &[&[&str]] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module of the crate, by path (`a::b`), with its source, except the crate roots.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = src_dir();
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut mods = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] || parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        mods.insert(parts.join("::"), std::fs::read_to_string(&f).unwrap());
    }
    mods
}

/// The code of a Rust file with comments, string and character literals replaced by spaces.
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && starts_literal(&b[..i]) {
            // A raw string: r"..." or r#"..."# (or br"...").
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push(' ');
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1}'), else a lifetime or a label.
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&k| b[k] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(k) => {
                    i = k + 1;
                    out.push(' ');
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether a literal's prefix letter after `before` starts a token (alone, or after a `b`).
fn starts_literal(before: &[char]) -> bool {
    match before {
        [.., p, 'b'] => !is_ident(p),
        [.., p] => !is_ident(p),
        [] => true,
    }
}

fn is_ident(c: &char) -> bool {
    c.is_alphanumeric() || *c == '_'
}

/// The paths of a use tree starting at `s` (just after `prefix::`), each as segments.
fn use_tree(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let skip_ws = |i: &mut usize| {
        while *i < s.len() && s[*i].is_whitespace() {
            *i += 1;
        }
    };
    skip_ws(i);
    if *i < s.len() && s[*i] == '{' {
        *i += 1;
        loop {
            skip_ws(i);
            if *i >= s.len() {
                return;
            }
            if s[*i] == '}' {
                *i += 1;
                return;
            }
            if s[*i] == ',' {
                *i += 1;
                continue;
            }
            let before = *i;
            use_tree(s, i, prefix, out);
            if *i == before {
                *i += 1;
            }
        }
    }
    let start = *i;
    while *i < s.len() && is_ident(&s[*i]) {
        *i += 1;
    }
    if *i == start {
        out.push(prefix.to_vec());
        return;
    }
    let mut path = prefix.to_vec();
    path.push(s[start..*i].iter().collect());
    let mut j = *i;
    while j < s.len() && s[j].is_whitespace() {
        j += 1;
    }
    if s.get(j) == Some(&':') && s.get(j + 1) == Some(&':') {
        *i = j + 2;
        use_tree(s, i, &path, out);
    } else {
        out.push(path);
    }
}

/// The module `path` names (the longest module it starts with), if any.
fn resolve(path: &[String], mods: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| mods.contains_key(m))
}

/// Module -> the modules it imports.
fn imports(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for (name, src) in mods {
        let code: Vec<char> = code_only(src).chars().collect();
        let file: Vec<String> = name.split("::").map(String::from).collect();
        let mut targets = BTreeSet::new();
        // The modules the file declares (`mod b;`), whose paths it may name bare (`b::x`).
        let children: Vec<String> = (0..code.len())
            .filter(|&k| (k == 0 || !is_ident(&code[k - 1])) && code[k..].starts_with(&['m', 'o', 'd', ' ']))
            .filter_map(|k| {
                let ident: String = code[k + 4..].iter().take_while(|c| is_ident(c)).collect();
                let rest = code[k + 4 + ident.len()..].iter().find(|c| !c.is_whitespace());
                (!ident.is_empty() && rest == Some(&';')).then_some(ident)
            })
            .collect();
        // Inline modules (`mod tests { ... }`) open inside the file: (name, brace depth inside).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while i < code.len() {
            match code[i] {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    while inline.last().is_some_and(|(_, d)| *d > depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
            let starts_word = i == 0 || !is_ident(&code[i - 1]);
            let word_at = |w: &str| code[i..].iter().take(w.len()).copied().eq(w.chars());
            if starts_word && word_at("mod ") {
                let mut j = i + 4;
                let start = j;
                while j < code.len() && is_ident(&code[j]) {
                    j += 1;
                }
                let ident: String = code[start..j].iter().collect();
                while j < code.len() && code[j].is_whitespace() {
                    j += 1;
                }
                if !ident.is_empty() && code.get(j) == Some(&'{') {
                    inline.push((ident, depth + 1));
                }
            }
            // The module the code at `i` is in: the file's, then any inline ones around it.
            let me: Vec<String> = file.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
            let prefix = if !starts_word {
                None
            } else if word_at("crate::") {
                Some((7, Vec::new()))
            } else if word_at("super::") && me.len() > 1 {
                Some((7, me[..me.len() - 1].to_vec()))
            } else if word_at("self::") {
                Some((6, me.clone()))
            } else if children.iter().any(|c| word_at(&format!("{c}::"))) && inline.is_empty() {
                // A bare path into a declared child, read from the child's name on.
                Some((0, file.clone()))
            } else {
                None
            };
            let Some((skip, base)) = prefix else {
                i += 1;
                continue;
            };
            i += skip;
            let mut paths = Vec::new();
            use_tree(&code, &mut i, &base, &mut paths);
            for p in paths {
                if let Some(m) = resolve(&p, mods) {
                    if &m != name {
                        targets.insert(m);
                    }
                }
            }
        }
        edges.insert(name.clone(), targets);
    }
    edges
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// One cycle's imports, `a -> b` for each pair inside it, for the message.
fn describe(cycle: &[String], edges: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut lines = Vec::new();
    for a in cycle {
        let inside: Vec<&str> = edges[a].iter().filter(|b| cycle.contains(b)).map(|b| b.as_str()).collect();
        lines.push(format!("    {a} -> {}", inside.join(", ")));
    }
    lines.join("\n")
}

#[test]
fn no_import_cycle_but_the_listed_ones() {
    let mods = modules();
    assert!(mods.contains_key("model") && mods.contains_key("replay") && mods.len() > 30, "{:?}", mods.keys());
    let edges = imports(&mods);
    let found = cycles(&edges);
    println!("{} modules; import cycles left: {}", mods.len(), found.len());
    for c in &found {
        println!("  {}\n{}", c.join(" <-> "), describe(c, &edges));
    }
    let allowed: Vec<Vec<String>> = ALLOWED_CYCLES.iter().map(|c| c.iter().map(|m| m.to_string()).collect()).collect();
    let new: Vec<&Vec<String>> = found
        .iter()
        .filter(|c| {
            let mut c = (*c).clone();
            c.sort();
            !allowed.iter().any(|a| {
                let mut a = a.clone();
                a.sort();
                a == c
            })
        })
        .collect();
    let gone: Vec<&Vec<String>> = allowed
        .iter()
        .filter(|a| {
            let mut a = (*a).clone();
            a.sort();
            !found.contains(&a)
        })
        .collect();
    assert!(
        new.is_empty(),
        "import cycles not allowed (a new cycle, or an allowed one that grew):\n{}",
        new.iter().map(|c| format!("  {}\n{}", c.join(" <-> "), describe(c, &edges))).collect::<Vec<_>>().join("\n")
    );
    assert!(gone.is_empty(), "these cycles are open now: remove them from ALLOWED_CYCLES: {gone:?}");
}

/// The analyzer's layers, lowest first, each a folder of `analyzer/src` (the commands are two:
/// `cmd`, what each command does, and the binary's `cli`, its arguments). `source`/`model`:
/// reading traces and snapshots, the trace and its facts, call sites, layout measures, units and
/// text escaping, outputs (the safe path, the JSON envelope, a report's document blocks);
/// `replay`: the one replay loop and its results; `analysis`: what-if, capacity search,
/// fragmentation, leaks, the diagnosis, categories, ranks, diff and picture data; `render`:
/// pictures, the report and exports; `cli`: the commands.
const LAYERS: &[(&str, &[&str])] = &[
    ("source/model", &["source", "model"]),
    ("replay", &["replay"]),
    ("analysis", &["analysis"]),
    ("render", &["render"]),
    ("cli", &["cli", "cmd"]),
];

/// Every file of `analyzer/src` but the crate roots is in a layer's folder: where a module sits
/// says which layer it is in.
#[test]
fn every_module_is_in_a_layer_folder() {
    let folders: Vec<&str> = LAYERS.iter().flat_map(|(_, f)| f.iter().copied()).collect();
    let mut loose = Vec::new();
    for e in std::fs::read_dir(src_dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let ok = if p.is_dir() { folders.contains(&name.as_str()) } else { name == "lib.rs" || name == "main.rs" };
        if !ok {
            loose.push(name);
        }
    }
    assert!(loose.is_empty(), "files or folders of analyzer/src outside the layers' folders: {loose:?}");
}

/// No import points up the layers ([`LAYERS`]): a module imports modules of its own layer or
/// below. Every module is in a layer (a new one must be placed).
#[test]
fn no_import_points_up_a_layer() {
    let mods = modules();
    let layer_of = |m: &str| -> Option<usize> {
        let top = m.split("::").next().unwrap();
        LAYERS.iter().position(|(_, ms)| ms.contains(&top))
    };
    let unplaced: Vec<&String> = mods.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(unplaced.is_empty(), "modules in no layer: {unplaced:?}");
    let edges = imports(&mods);
    let mut upward = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            let (a, b) = (layer_of(from).unwrap(), layer_of(to).unwrap());
            if b > a {
                upward.push(format!("{from} ({}) -> {to} ({})", LAYERS[a].0, LAYERS[b].0));
            }
        }
    }
    println!("{} modules in {} layers; imports pointing up: {}", mods.len(), LAYERS.len(), upward.len());
    assert!(upward.is_empty(), "imports pointing up a layer:\n  {}", upward.join("\n  "));
}

/// The reader of imports sees what it must: `use` trees with groups and nesting, paths in
/// expressions, `super::`, and nothing in comments or strings.
#[test]
fn imports_are_read_from_code_only() {
    let mut mods = BTreeMap::new();
    for m in ["a", "b", "c", "d", "e", "f", "g", "h", "a::x"] {
        mods.insert(m.to_string(), String::new());
    }
    mods.insert(
        "a::x".to_string(),
        "use crate::{b::{self, T}, c::U};\n\
         // crate::d::V in a comment\n\
         /* crate::e in /* a nested */ block comment */\n\
         fn f<'a>(s: &'a str) -> char { let _ = \"crate::f::W\"; let _ = r#\"crate::g\"#; \
         super::Y; crate::h::z(); 'x' }"
            .to_string(),
    );
    // `super::` inside an inline module is the file's own module, not its parent.
    mods.insert(
        "a::y".to_string(),
        "fn g() {}\n#[cfg(test)]\nmod tests { use super::*; fn t() { super::g(); } }".to_string(),
    );
    let edges = imports(&mods);
    let got: Vec<&str> = edges["a::x"].iter().map(|s| s.as_str()).collect();
    assert_eq!(got, ["a", "b", "c", "h"]);
    assert!(edges["a::y"].is_empty(), "{:?}", edges["a::y"]);
    let mut two = BTreeMap::new();
    two.insert("p".to_string(), "use crate::q::Q;".to_string());
    two.insert("q".to_string(), "fn g() { crate::p::P::new(); }".to_string());
    two.insert("r".to_string(), "use crate::p;".to_string());
    assert_eq!(cycles(&imports(&two)), vec![vec!["p".to_string(), "q".to_string()]]);
}

/// One replay loop in the analyzer: a replay steps its engine over the records in one place
/// (`drive` in `replay/mod.rs`), the only code that makes a replay's pass over the records; every
/// other replay (what-if settings, capacity probes, checkpoints, analyses' observers) is a job
/// of it. Folds without an engine (`Trace::scan`) are not replays.
#[test]
fn one_replay_loop() {
    let mods = modules();
    let mut steps = Vec::new();
    let mut passes = Vec::new();
    let mut engines = Vec::new();
    for (name, src) in &mods {
        let code = code_only(src);
        steps.extend(std::iter::repeat_n(name.clone(), code.matches(".step(").count()));
        passes.extend(std::iter::repeat_n(name.clone(), code.matches(".replay_pass(").count()));
        // An engine built to replay a trace's records outside `replay` would be a second loop
        // (`synth` builds one to generate a trace, not to replay one).
        if code.contains("Engine::new(") && name != "replay" && name != "source::synth" {
            engines.push(name.clone());
        }
        // So would a request served or freed by an engine however it was obtained.
        for call in [".malloc(", ".malloc_owned(", ".free(", ".free_requested(", ".free_completed(", ".empty_cache("] {
            if code.contains(&format!("engine{call}")) && name != "replay" && name != "source::synth" {
                engines.push(format!("{name}: engine{call}"));
            }
        }
    }
    assert_eq!(steps, ["replay"], "records are stepped in one place");
    assert_eq!(passes, ["replay"], "one pass of the replay loop");
    assert!(engines.is_empty(), "engines built outside the replay: {engines:?}");
    let replay = code_only(&mods["replay"]);
    assert_eq!(replay.matches("scan_chunks").count(), 0, "the replay reads records through its pass only");
}

/// Renderers take data and a writer, never a path: no module of `render` opens, reads or
/// writes a file or opens a trace (the commands do, through the one opener and the safe output
/// path).
#[test]
fn renderers_never_touch_files() {
    let mods = modules();
    let mut found = Vec::new();
    for (name, src) in mods.iter().filter(|(m, _)| m.starts_with("render")) {
        let code = code_only(src);
        for what in ["fs::", "File::", "write_file", "Trace::open", "input::open", "OpenOptions"] {
            if code.contains(what) {
                found.push(format!("{name}: {what}"));
            }
        }
    }
    assert!(found.is_empty(), "renderers touching files: {found:?}");
}
