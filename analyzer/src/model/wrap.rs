//! Prose wrapped at [`WIDTH`] columns, for a terminal and for `report.md` (tables, code and
//! pictures are not prose and are never wrapped).

/// The column prose is wrapped at.
pub const WIDTH: usize = 100;

/// Splits `text` into lines of at most `width` columns (a word longer than a line stands alone),
/// at spaces only. `markdown`: never inside an inline code span, and never so that a line starts
/// with what Markdown would read as a heading, quote, list item, table row or fence.
pub fn lines(text: &str, width: usize, markdown: bool) -> Vec<String> {
    lines_after(text, width, width, markdown)
}

/// [`lines`], the first line of at most `first` columns and the others of `width` (a first line
/// that follows a label, the others under a shorter indentation).
pub fn lines_after(text: &str, first: usize, width: usize, markdown: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut line = String::new();
    // Words, where a word inside a code span takes the spaces up to its end with it.
    let words: Vec<String> =
        if markdown { markdown_words(text) } else { text.split(' ').map(str::to_string).collect() };
    for w in with_units(words) {
        let room = if out.is_empty() { first } else { width };
        let fits = line.chars().count() + 1 + w.chars().count() <= room;
        if line.is_empty() || fits || (markdown && starts_block(&w)) {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&w);
        } else {
            out.push(std::mem::take(&mut line));
            line = w;
        }
    }
    out.push(line);
    out
}

/// The words, a unit of bytes joined to the number before it ("2.63 GiB" is never split over
/// two lines).
fn with_units(words: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    for w in words {
        let unit = w.trim_end_matches([')', ']', ',', '.', ';', ':']);
        let is_unit = matches!(unit, "B" | "KiB" | "MiB" | "GiB" | "TiB" | "bytes");
        match out.last_mut() {
            Some(number) if is_unit && number.ends_with(|c: char| c.is_ascii_digit()) => {
                number.push(' ');
                number.push_str(&w);
            }
            _ => out.push(w),
        }
    }
    out
}

/// `text` split at the spaces a Markdown renderer reads as spaces between words: not those inside
/// a code span (a run of N backticks up to the next run of exactly N, as CommonMark pairs them),
/// and a backslash-escaped backtick opens none.
fn markdown_words(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let (mut words, mut word) = (Vec::new(), String::new());
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            ' ' => {
                words.push(std::mem::take(&mut word));
                i += 1;
            }
            '\\' => {
                let end = (i + 2).min(chars.len());
                word.extend(&chars[i..end]);
                i = end;
            }
            '`' => {
                let n = run_at(i);
                // The next run of exactly `n` backticks closes the span; without one the run is text.
                let mut j = i + n;
                let mut close = None;
                while j < chars.len() {
                    if chars[j] == '`' {
                        let m = run_at(j);
                        if m == n {
                            close = Some(j);
                            break;
                        }
                        j += m;
                    } else {
                        j += 1;
                    }
                }
                let end = close.map_or(i + n, |c| c + n);
                word.extend(&chars[i..end]);
                i = end;
            }
            c => {
                word.push(c);
                i += 1;
            }
        }
    }
    words.push(word);
    words
}

/// Whether a line starting with `word` would be read as Markdown structure.
fn starts_block(word: &str) -> bool {
    let digits = word.trim_start_matches(|c: char| c.is_ascii_digit());
    matches!(word, "-" | "+" | "*")
        || word.starts_with(['#', '>', '|', '=', '~', '<'])
        || word.starts_with("```")
        || (digits.len() < word.len() && (digits == "." || digits == ")"))
}

/// `text` wrapped for a terminal: the first line after `first`, the others after `rest`. For
/// terminal output only: `text` is escaped with [`crate::model::escape::terminal`] first (a sentence
/// that quotes a call site or a mark from the trace stays one paragraph, and a newline or tab of
/// the trace's shows as `\n`, `\t`), so it is given raw, never escaped already.
pub fn indented(text: &str, first: &str, rest: &str) -> String {
    let room = |lead: &str| WIDTH.saturating_sub(lead.chars().count()).max(20);
    lines_after(&crate::model::escape::terminal(text), room(first), room(rest), false)
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{}{l}", if i == 0 { first } else { rest }))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` after `lead` (a table row's figures), its continuation lines under where `text` starts:
/// [`indented`] with the lead's width in spaces.
pub fn under_lead(text: &str, lead: &str) -> String {
    indented(text, lead, &" ".repeat(lead.chars().count()))
}

/// A writer for a command's text output that keeps every line within [`WIDTH`] columns: a longer
/// line is wrapped at spaces, its continuation lines indented to where its value starts (after
/// the label that ends in a run of two spaces, as in `outcome         OOM at ...`), else two
/// spaces past its own indentation. A word longer than a line (a URL) stands alone. The text is
/// written as given: escaping is the caller's.
pub struct ScreenWriter<'a> {
    out: &'a mut dyn std::io::Write,
    line: Vec<u8>,
}

impl<'a> ScreenWriter<'a> {
    pub fn new(out: &'a mut dyn std::io::Write) -> Self {
        ScreenWriter { out, line: Vec::new() }
    }

    fn emit(&mut self) -> std::io::Result<()> {
        // No line ends in spaces (a wrapped sentence's double space left one).
        let line = String::from_utf8_lossy(&self.line).trim_end().to_string();
        self.line.clear();
        if line.chars().count() <= WIDTH {
            return writeln!(self.out, "{line}");
        }
        let lead = line.len() - line.trim_start_matches(' ').len();
        // The value's column: the end of the first run of two or more spaces after the label.
        let value_at = line[lead..].find("  ").map(|k| {
            let after = lead + k;
            after + line[after..].len() - line[after..].trim_start_matches(' ').len()
        });
        // Split there (else after the indentation); continue at that column (else two further).
        let (split, cont) = match value_at.filter(|&c| c <= WIDTH / 2) {
            Some(c) => (c, line[..c].chars().count()),
            None => (lead, lead + 2),
        };
        let (head, body) = line.split_at(split);
        let width = WIDTH.saturating_sub(head.chars().count().max(cont)).max(20);
        // A figure stays with its unit ("1.37 MiB") and a segment map's block tag with its size
        // ("F 1.37 MiB"): joined by a mark no text holds (a terminal-escaped line holds no
        // control character) while the line is split.
        const GLUE: char = '\u{1}';
        let mut glued = String::new();
        let mut prev = "";
        for (k, w) in body.split(' ').enumerate() {
            let unit = matches!(w, "B" | "KiB" | "MiB" | "GiB" | "TiB" | "ms" | "us" | "ns" | "s");
            let tagged = matches!(prev, "A" | "F" | "P") && w.starts_with(|c: char| c.is_ascii_digit());
            if k > 0 {
                let figure = prev.ends_with(|c: char| c.is_ascii_digit());
                glued.push(if (unit && figure) || tagged { GLUE } else { ' ' });
            }
            glued.push_str(w);
            prev = w;
        }
        for (i, l) in
            lines(&glued, width, false).iter().map(|l| l.replace(GLUE, " ").trim_end().to_string()).enumerate()
        {
            if i == 0 {
                writeln!(self.out, "{head}{l}")?;
            } else {
                writeln!(self.out, "{}{l}", " ".repeat(cont))?;
            }
        }
        Ok(())
    }
}

impl std::io::Write for ScreenWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            if b == b'\n' {
                self.emit()?;
            } else {
                self.line.push(b);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.line.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
            write!(self.out, "{rest}")?;
        }
        self.out.flush()
    }
}

impl Drop for ScreenWriter<'_> {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_spaces_within_the_width() {
        let text = "the request needs one contiguous block of 1.00 GiB and the largest free block is 4.00 MiB; \
                    no segment is wholly free, so releasing the cache frees 0 B";
        let l = lines(text, 40, false);
        assert!(l.iter().all(|l| l.chars().count() <= 40), "{l:?}");
        assert_eq!(l.join(" "), text);
        assert_eq!(lines("a-very-long-word-without-spaces", 5, false), vec!["a-very-long-word-without-spaces"]);
    }

    #[test]
    fn markdown_keeps_fenced_spans_whole_and_escaped_backticks_open_none() {
        // A span fenced by two backticks holds a single one; an escaped backtick is text.
        let l = lines("from ``u.py:4 (x` # INJECTED HEADING `y)`` and \\` # not code \\` here", 12, true);
        assert!(l.iter().any(|l| l.contains("``u.py:4 (x` # INJECTED HEADING `y)``")), "{l:?}");
        assert!(l.iter().all(|l| !l.starts_with('#')), "{l:?}");
        assert_eq!(l.join(" "), "from ``u.py:4 (x` # INJECTED HEADING `y)`` and \\` # not code \\` here");
    }

    #[test]
    fn markdown_keeps_code_spans_whole_and_never_starts_a_block() {
        let l = lines("set `max_split_size_mb:128 and more` now", 12, true);
        assert!(l.contains(&"`max_split_size_mb:128 and more`".to_string()), "{l:?}");
        for risky in ["- x", "# x", "> x", "| x", "1. x", "12) x", "```x"] {
            let l = lines(&format!("aaaa bbbb {risky}"), 9, true);
            assert!(l.iter().skip(1).all(|l| !l.starts_with(&risky[..1])), "{risky}: {l:?}");
        }
    }

    #[test]
    fn a_number_and_its_unit_stay_on_one_line() {
        let text = "the request needs one contiguous block of 392.63 MiB and the largest free block is 178.00 GiB;";
        for width in 10..text.len() {
            for l in lines(text, width, false).iter().chain(&lines(text, width, true)) {
                assert!(!l.starts_with("MiB") && !l.starts_with("GiB;"), "{width}: {l:?}");
            }
        }
        // A unit after a word that is not a number stays a word of its own.
        assert_eq!(lines("in MiB", 3, false), ["in", "MiB"]);
    }

    #[test]
    fn indented_lines() {
        let s = indented(&"word ".repeat(40), "  - ", "    ");
        assert!(s.lines().all(|l| l.chars().count() <= WIDTH));
        assert!(s.starts_with("  - word") && s.lines().nth(1).unwrap().starts_with("    word"));
        // A function name of the trace's with a newline and a tab stays on its line, escaped.
        let s = indented("free the blocks from a.py:5 (f\n\tg)", "also: ", "  ");
        assert_eq!(s, "also: free the blocks from a.py:5 (f\\n\\tg)");
        // Each line takes the room its own lead leaves: after a long label the first line is
        // shorter, the lines under a short indentation run to the width.
        let s = indented(&"word ".repeat(60), "suggestion: ", "  ");
        let widths: Vec<usize> = s.lines().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w <= WIDTH), "{widths:?}");
        assert!(widths[1] > WIDTH - 5, "a continuation line of {} columns: {s}", widths[1]);
    }

    /// A long line wraps under its value's column, a figure keeps its unit, a word longer than
    /// a line stands alone, and a line that fits is left as it is.
    #[test]
    fn screen_writer_wraps_under_the_value() {
        use std::io::Write;
        let mut out = Vec::new();
        {
            let mut w = ScreenWriter::new(&mut out);
            let long = format!("outcome         {}", "a request of 12.50 MiB failed; ".repeat(5));
            writeln!(w, "{long}").unwrap();
            writeln!(w, "short line").unwrap();
            write!(w, "  {}", "x".repeat(120)).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH || !l.trim().contains(' ')), "{text}");
        assert!(lines[0].starts_with("outcome         a request"), "{text}");
        assert!(lines[1].starts_with(&" ".repeat(16)) && !lines[1].starts_with(&" ".repeat(17)), "{text}");
        assert!(lines.iter().all(|l| !l.trim_start().starts_with("MiB")), "a unit apart from its figure: {text}");
        assert!(lines.contains(&"short line"), "{text}");
        assert_eq!(*lines.last().unwrap(), format!("  {}", "x".repeat(120)));
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let expected = format!("outcome {}", "a request of 12.50 MiB failed; ".repeat(5));
        assert!(words(&text).starts_with(words(&expected).as_str()), "{text}");
    }
}
