//! `alloctrace report`: the sections, a self-contained HTML page, summary.json, the shipped
//! reports in `reports/` kept current, and the page rendered by a headless browser.

mod pictures_gen;

use analyzer::render::report::{build, PictureLinks, ReportOptions};
use pictures_gen::*;
use std::process::Command;

fn frag_oom_report() -> analyzer::render::report::Report {
    build(
        &analyzer::model::Trace::open(&shipped("frag_oom.default.atrace")).unwrap(),
        &ReportOptions { search_capacity: true, search_long_traces: false },
    )
    .expect("report")
}

#[test]
fn markdown_has_every_section_and_the_oom_explained() {
    let r = frag_oom_report();
    let md = r.markdown();
    for section in [
        "# Memory report: `frag_oom.default.atrace`",
        "## Environment",
        "| device | NVIDIA H100 80GB HBM3 |",
        "| capacity limit | 2.00 GiB (recorded) |",
        "## Summary",
        "## Findings",
        "### Out of memory (problem)",
        "**What it is.**",
        "## Why: explain, fragmentation, leaks",
        "### Diagnosis: fragmentation",
        "CUDA out of memory. Tried to allocate 1024.00 MiB",
        "### Fragmentation, four ways",
        // A trace that stops at its failure: what is live there is no leak by itself.
        "### Still live at the failure, and growth",
        "## What if: other allocator settings",
        "| `expandable_segments:True` |",
        "No allocator needs less than the peak of live requested bytes",
        "## Pictures",
        "[![Memory over time](timeline.png)](timeline.svg)",
        "[![Segments at out of memory",
        "(segments.png)](segments.svg)",
        "(whatif.png)](whatif.svg)",
        "(frag.png)](frag.svg)",
    ] {
        assert!(md.contains(section), "no {section:?} in report.md:\n{md}");
    }
    // The first screen: the title, then explain's verdict and its first advice, word for word,
    // then the picture that shows it; the tables come after.
    let x = r.explain.as_ref().expect("explained");
    let mut paras = md.split("\n\n");
    assert_eq!(paras.next(), Some("# Memory report: `frag_oom.default.atrace`"));
    let verdict = paras.next().unwrap();
    assert!(verdict.starts_with("**Verdict: fragmentation.**"), "{verdict}");
    assert!(verdict.replace('\n', " ").contains(&x.verdict.reason), "{verdict}");
    // The trace stops at the failure: the reordering gets past it, a suggestion (not proven).
    let fix = paras.next().unwrap().replace('\n', " ");
    assert!(fix.starts_with("**Suggestion:**") && fix.contains(&x.advice[0].text), "{fix}");
    assert!(md.find("**Suggestion:**") < md.find("| verdict | finding | value |"));
    assert!(md.find("(segments.png)") < md.find("## Findings"), "the OOM's segment map leads");
    // The OOM is fragmentation: 920 MiB free in 4 MiB pieces + 200 MiB unreserved > 1 GiB. The
    // finding states explain's diagnosis (one classification of the OOM).
    let oom = r.findings.iter().find(|f| f.id == "oom").expect("oom finding");
    assert!(oom.explanation.contains("Diagnosis: fragmentation"), "{}", oom.explanation);
    assert!(oom.explanation.contains("the largest free block is 4.00 MiB"), "{}", oom.explanation);
    // No allocator setting in the what-if table gets past the failure under the 2 GiB limit, and
    // releasing the cache cannot help (the OOM path already did). The table's no-caching row does
    // (a device allocation per request: 1.90 GiB, the live bytes with the request), and the
    // finding names it as the one way past, not as a whole job that completes.
    assert!(
        oom.explanation.contains("the replay gets past the request that failed with no caching")
            && !oom.explanation.contains("PYTORCH_CUDA_ALLOC_CONF")
            && !oom.explanation.contains("completes with"),
        "{}",
        oom.explanation
    );
    assert!(!oom.explanation.contains("can help"), "{}", oom.explanation);
    // The program allocates single tensors one after another (no iteration marks, no annotation)
    // and frees everything by the end: single allocations are not iterations, so no growth per
    // iteration is claimed, and nothing is live at the end.
    let growth = r.findings.iter().find(|f| f.id == "live_at_end").expect("live-at-end finding");
    assert!(!growth.title.contains("grows every iteration"), "{}", growth.title);
    assert_eq!(growth.value, "0 blocks, 0 B");
    let pieces = r.findings.iter().find(|f| f.id == "free_memory_in_pieces").expect("contiguity finding");
    assert_eq!(pieces.value, "99.6%");
    assert!(r.analysis_errors.is_empty(), "{:?}", r.analysis_errors);
    assert!(r.explain.is_some() && r.frag.is_some() && r.leaks.is_some());
}

#[test]
fn html_is_self_contained() {
    let r = frag_oom_report();
    let html = r.html();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.contains("<script"), "no scripts");
    for remote in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(remote), "fetches {remote}");
    }
    assert_eq!(html.matches("<svg").count(), r.pictures.len(), "every picture inline");
    let body = &html[html.find("<body>").unwrap()..];
    assert!(body.find("<strong>Verdict: fragmentation.</strong>") < body.find("<h2>"), "the verdict comes first");
    assert!(html.contains("<h2>Findings</h2>") && html.contains("<td class=\"problem\">problem</td>"));
    let json: serde_json::Value = serde_json::from_str(&r.json().unwrap()).expect("summary.json parses");
    for key in
        ["environment", "summary", "replay", "findings", "whatif", "layout", "pictures", "explain", "frag", "leaks"]
    {
        assert!(json.get(key).is_some(), "summary.json has no {key}");
    }
    for part in ["whatif", "explain", "frag", "leaks"] {
        assert_eq!(json[part]["trace"], "frag_oom.default.atrace", "no machine path in the report");
    }
}

/// A PNG beside every SVG, and `--inline-pictures`' Markdown carries them as `data:` URIs.
#[test]
fn pictures_as_png_files_or_inline() {
    let r = frag_oom_report();
    let dir = temp_dir("png");
    let files = analyzer::model::output::write_report(&dir, &[], &r.files(PictureLinks::Files).unwrap()).unwrap();
    for p in &r.pictures {
        let png = std::fs::read(dir.join(&p.png_file)).expect("PNG beside the SVG");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{}", p.png_file);
        let (w, h) =
            (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!(w, analyzer::render::plot::WIDTH, "{}: drawn at the SVG's size", p.png_file);
        assert!(h >= analyzer::render::plot::HEIGHT, "{}", p.png_file);
        assert!(png.len() < 200_000, "{}: {} bytes", p.png_file, png.len());
    }
    assert_eq!(files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")).count(), r.pictures.len());
    let inline = r.markdown_with(analyzer::render::report::PictureLinks::Inline);
    assert_eq!(inline.matches("](data:image/png;base64,").count(), r.pictures.len());
    assert!(!inline.contains(".png)"), "no picture left as a file link");
    let _ = std::fs::remove_dir_all(dir);
}

/// `reports/` must be what the CLI makes of `traces/` today (`scripts/update-reports.sh`).
#[test]
fn shipped_reports_are_current() {
    let tmp = temp_dir("reports");
    let mut traces: Vec<_> = std::fs::read_dir(workspace().join("traces"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "atrace"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 6);
    for trace in traces {
        let name = trace.file_stem().unwrap().to_string_lossy().into_owned();
        let fresh = tmp.join(&name);
        build(
            &analyzer::model::Trace::open(&trace).unwrap(),
            &ReportOptions { search_capacity: true, search_long_traces: false },
        )
        .unwrap()
        .files(PictureLinks::Files)
        .and_then(|files| analyzer::model::output::write_report(&fresh, &[], &files))
        .unwrap();
        let shipped_dir = workspace().join("reports").join(&name);
        let mut files: Vec<_> = std::fs::read_dir(&fresh).unwrap().map(|e| e.unwrap().file_name()).collect();
        files.sort();
        for f in files {
            let a = std::fs::read(fresh.join(&f)).unwrap();
            let b = std::fs::read(shipped_dir.join(&f)).unwrap_or_default();
            assert!(a == b, "reports/{name}/{} is not current: run scripts/update-reports.sh", f.to_string_lossy());
        }
    }
    let _ = std::fs::remove_dir_all(tmp);
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
}

fn screenshot(browser: &str, url: &str, png: &std::path::Path, profile: &std::path::Path) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .expect("run the browser");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Renders report.html in headless Chromium: no console messages, and the screenshot is far
/// from blank (a PNG of a blank page compresses to a few KB; the report's to far more).
/// Skips, saying why, where no Chromium is installed.
#[test]
fn html_renders_in_a_headless_browser() {
    let Some(browser) = chromium() else {
        eprintln!("skipped: no chromium on PATH (apt-get install chromium to run this test)");
        return;
    };
    let dir = temp_dir("browser");
    let files = frag_oom_report().files(PictureLinks::Files).unwrap();
    analyzer::model::output::write_report(&dir.join("report"), &[], &files).unwrap();
    std::fs::write(dir.join("blank.html"), "<!DOCTYPE html><html><body></body></html>").unwrap();
    let page = dir.join("report/report.html");
    let log = screenshot(browser, &format!("file://{}", page.display()), &dir.join("report.png"), &dir.join("p1"));
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    screenshot(
        browser,
        &format!("file://{}", dir.join("blank.html").display()),
        &dir.join("blank.png"),
        &dir.join("p2"),
    );
    let png = std::fs::read(dir.join("report.png")).expect("screenshot written");
    let blank = std::fs::read(dir.join("blank.png")).expect("blank screenshot written");
    assert_eq!(&png[1..4], b"PNG");
    assert!(png.len() > 10 * blank.len(), "report {} bytes vs blank page {} bytes", png.len(), blank.len());
    let _ = std::fs::remove_dir_all(dir);
}

/// report.md's prose is wrapped at 100 columns (tables, code and pictures are not prose).
#[test]
fn markdown_prose_is_wrapped_at_100_columns() {
    let md = frag_oom_report().markdown();
    let mut code = false;
    for l in md.lines() {
        if l.starts_with("```") {
            code = !code;
        }
        if code || l.starts_with('|') || l.starts_with("[![") || l.starts_with("```") {
            continue;
        }
        assert!(l.chars().count() <= 100, "{} columns: {l}", l.chars().count());
    }
}
