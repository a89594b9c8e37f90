//! `--stacks` with PyTorch's own allocator, on a GPU: a small model's training steps run under
//! the shim (PyTorch's stacks given ids under its lock, resolved on the shim's thread). Every
//! allocation is named; each call site is defined once, before its first use; forward
//! allocations name the script's lines, backward ones the autograd node that made them; the
//! shim's own frames never appear. Ignored by default (needs a GPU, PyTorch and a compiler for
//! the helper): run with
//! `ALLOCTRACE_LIB=target/release/librecorder.so cargo test -p alloctrace-recorder --features cuda --test shim_callsites_gpu -- --ignored`.
#![cfg(feature = "cuda")]

use recorder::trace::{Event, TraceEnd, TraceReader, NO_CALLSITE};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = r#"import torch
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    loss = m(torch.randn(64, 256, device="cuda")).square().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print("steps done")
"#;

#[test]
#[ignore = "needs a GPU, PyTorch and a C++ compiler"]
fn every_allocation_of_a_training_step_is_named() {
    let lib = std::env::var("ALLOCTRACE_LIB").expect("ALLOCTRACE_LIB: the recorder library built with --features cuda");
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("alloctrace-shim-sites-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("model_step.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let trace = dir.join("run.atrace");
    let o = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", here.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("ALLOCTRACE_LIB", &lib)
        .env("ALLOCTRACE_STACKS", "1")
        .env("ALLOCTRACE_OUTPUT", &trace)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && out.contains("steps done"), "{out}\n{err}");
    assert!(!err.contains("alloctrace:"), "the shim said something: {err}");

    let mut r = TraceReader::open(&trace).unwrap();
    let mut sites: HashMap<u32, Vec<recorder::trace::Frame>> = HashMap::new();
    let (mut allocs, mut unnamed) = (0, 0);
    let (mut script_line, mut backward_node) = (false, false);
    for rec in r.read_all() {
        match rec.event {
            Event::CallSite { id, frames } => {
                assert!(frames.iter().all(|f| !f.file.ends_with("alloctrace_hook.py")), "{frames:?}");
                assert!(sites.insert(id, frames).is_none(), "call site {id} defined twice");
            }
            Event::Alloc { callsite, .. } => {
                allocs += 1;
                if callsite == NO_CALLSITE {
                    unnamed += 1;
                    continue;
                }
                let frames =
                    sites.get(&callsite).unwrap_or_else(|| panic!("call site {callsite} used before it is defined"));
                script_line |= frames.iter().any(|f| f.file.ends_with("model_step.py") && f.line == 5);
                backward_node |=
                    frames.len() == 1 && frames[0].file == "<autograd>" && frames[0].function.ends_with("Backward0");
            }
            _ => {}
        }
    }
    assert!(matches!(r.end(), TraceEnd::Complete { .. }), "{:?}", r.end());
    assert!(allocs > 10, "{allocs} allocations");
    assert_eq!(unnamed, 0, "{unnamed} of {allocs} allocations without a call site");
    assert!(script_line, "no forward allocation names the script's line 5");
    assert!(backward_node, "no backward allocation names its autograd node");
    let _ = std::fs::remove_dir_all(&dir);
}
