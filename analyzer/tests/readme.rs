//! Every `alloctrace ...` command in the shell blocks of the README and of the documents it
//! links in `docs/` runs and exits 0 (or 3 never): the front door stays true. Inputs that they
//! name generically (`snap.pickle`) are a shipped snapshot; outputs go to a temporary folder;
//! `synth` sizes are capped to keep the test fast in debug builds.

use std::path::Path;
use std::process::Command;

#[test]
fn readme_commands_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = std::env::temp_dir().join(format!("alloctrace-readme-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let ran = run_shell_blocks(&root, &root.join("README.md"), &tmp);
    assert!(ran >= 10, "only {ran} README commands found");
    // The reference moved out of the README keeps its commands checked too.
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    let in_docs: usize = docs.iter().map(|d| run_shell_blocks(&root, d, &tmp)).sum();
    assert!(in_docs >= 20, "only {in_docs} commands found in docs/");
    std::fs::remove_dir_all(&tmp).ok();
}

/// Runs the `alloctrace` commands of `file`'s `sh` blocks; returns how many ran.
fn run_shell_blocks(root: &Path, file: &Path, tmp: &Path) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    let snapshot = root.join("analyzer/tests/fixtures/torch/frag_oom.default.pickle");
    let mut in_sh = false;
    let mut ran = 0;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let cmd = line.split('#').next().unwrap().trim();
        let cmd = cmd.strip_prefix("cargo run --release -p alloctrace -- ").map(|c| format!("alloctrace {c}"));
        let cmd = cmd.unwrap_or_else(|| line.split('#').next().unwrap().trim().to_string());
        let Some(args) = cmd.strip_prefix("alloctrace ") else { continue };
        let mut words: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        if words.iter().any(|w| w.contains('|')) {
            let cut = words.iter().position(|w| w == "|").unwrap();
            words.truncate(cut);
        }
        for i in 0..words.len() {
            if words[i] == "snap.pickle" {
                words[i] = snapshot.display().to_string();
            }
            if i > 0 && (words[i - 1] == "-o" || words[i - 1] == "--output") {
                words[i] = tmp.join(&words[i]).display().to_string();
            }
            if i > 0 && words[i - 1] == "--events" {
                let n: u64 = words[i].parse().unwrap();
                words[i] = n.min(100_000).to_string();
            }
        }
        let o = Command::new(env!("CARGO_BIN_EXE_alloctrace")).args(&words).current_dir(root).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{name}: command `{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
        assert!(!o.stdout.is_empty() || words.iter().any(|w| w == "-o"), "{name}: `{cmd}` printed nothing");
        ran += 1;
    }
    ran
}

/// Where the README shows what a command prints (a `text` block right after an `sh` block of one
/// command), the command prints those lines today.
#[test]
fn readme_outputs_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks: Vec<(String, Vec<&str>)> = {
        let mut out = Vec::new();
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            if let Some(kind) = line.strip_prefix("```").filter(|k| !k.is_empty()) {
                let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
                out.push((kind.to_string(), body));
                // What lies between two blocks breaks the pair unless it is blank.
                if lines.peek().is_some_and(|l| !l.trim().is_empty() && !l.starts_with("```")) {
                    out.push(("prose".into(), Vec::new()));
                }
            }
        }
        out
    };
    let mut checked = 0;
    for pair in blocks.windows(2) {
        let [(sh, cmd), (shown, lines)] = pair else { continue };
        if sh != "sh" || shown != "text" || cmd.len() != 1 {
            continue;
        }
        let Some(args) = cmd[0].trim().strip_prefix("alloctrace ") else { continue };
        let o = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
            .args(args.split_whitespace())
            .current_dir(&root)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&o.stdout);
        let printed: Vec<&str> = printed.lines().map(str::trim_end).collect();
        for l in lines.iter().filter(|l| !l.trim().is_empty()) {
            assert!(
                printed.contains(&l.trim_end()),
                "README shows {l:?} for `{}`; it prints:\n{}",
                cmd[0],
                printed.join("\n")
            );
        }
        checked += 1;
    }
    assert!(checked >= 1, "no command output shown in the README was found");
}
