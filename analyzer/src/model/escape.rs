//! Escaping of strings that come from a trace or a snapshot (device name, notes, command line,
//! settings, call-site files and functions, mark texts), for every output alloctrace writes.
//!
//! A trace is input from someone else: its strings may hold a backtick that closes a Markdown
//! code span, a newline that breaks out of a table or forges a line of `dump`, `<script>`,
//! an ANSI escape that rewrites the terminal, or a control character that makes an SVG invalid
//! XML. Every renderer passes such a string through the function for its output, here, at the
//! point where it is emitted:
//!
//! | output | function | what it does |
//! |---|---|---|
//! | terminal (text output, warnings) | [`terminal`] | control characters (C0, tab included, DEL, C1) and bidirectional overrides become visible escapes (`\n`, `\t`, `\x1b`, `\u{202e}`): the string stays on its line and in its column |
//! | Markdown text and table cells | [`markdown`] | as [`terminal`], then HTML-escaped and Markdown punctuation backslash-escaped |
//! | Markdown code span | [`markdown_code`] | as [`terminal`], a fence longer than any backtick run inside, `\|` for table pipes |
//! | the report's text (inline `code`, `**bold**`, `*em*` around interpolated strings) | [`report_markdown`], [`report_html`] | code spans kept literal; everything else escaped as text |
//! | the report's text in `summary.json` | [`report_plain`] | the markup dropped: code spans give their content, escaped characters themselves |
//! | HTML text and attributes | [`html`] | as [`terminal`], then `& < > "` as entities |
//! | SVG / XML text and attributes | [`xml`] | as [`html`] (control characters are invalid XML even as entities, so they are shown escaped) |
//!
//! JSON output goes through `serde_json`, which escapes quotes, backslashes and every control
//! character, so a string there needs nothing more: `--json` and `summary.json` carry a trace's
//! strings as the trace holds them. The model (call-site labels, the analyses' sentences) keeps
//! them raw too; only the writer of an output escapes, once.
//!
//! ```text
//! "a`b\n# x<img>"  markdown_code -> ``a`b\n# x<img>``   (the newline is the two characters `\` `n`)
//!                  html          -> a`b\n# x&lt;img&gt;
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;

/// True for characters a terminal or a document must not receive raw from a trace: C0 controls
/// but tab, DEL, C1 controls, the bidirectional overrides, isolates and marks (which reorder
/// what the reader sees), invisible characters (zero-width ones, the soft hyphen, the BOM, tag
/// characters), the line and paragraph separators, and U+FFFE and U+FFFF (not allowed in XML).
fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(
            c,
            '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{2029}'
                | '\u{2060}'..='\u{2064}'
                | '\u{061c}'
                | '\u{00ad}'
                | '\u{feff}'
                | '\u{fffe}'..='\u{ffff}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// Prints a warning to stderr, as every command does: `alloctrace: warning: ` and the text with
/// no control character raw (a trace's strings reach warnings too).
pub fn warn(w: impl std::fmt::Display) {
    eprintln!("alloctrace: warning: {}", terminal(&w.to_string()));
}

/// `s` with every unsafe character, and tab, shown as an escape: `\n`, `\t`, `\r`, `\x1b`,
/// `\u{202e}`; a backslash stays one backslash (the escapes are for a person to read, not to be
/// undone). The result holds no character this escapes, so escaping it again changes nothing.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\t' || is_unsafe(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if is_unsafe(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// For HTML text and double-quoted attribute values.
pub fn html(s: &str) -> Cow<'_, str> {
    let t = terminal(s);
    if !t.contains(['&', '<', '>', '"']) {
        return t;
    }
    let mut out = String::with_capacity(t.len() + 16);
    for c in t.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// For SVG and other XML text and attribute values.
pub fn xml(s: &str) -> Cow<'_, str> {
    html(s)
}

/// For Markdown text and table cells: no markup of the trace's survives (HTML is escaped,
/// Markdown punctuation is backslash-escaped, a newline cannot end the line or the table row).
pub fn markdown(s: &str) -> String {
    let h = html(s);
    let mut out = String::with_capacity(h.len() + 8);
    for c in h.chars() {
        if matches!(
            c,
            '\\' | '`'
                | '*'
                | '_'
                | '{'
                | '}'
                | '['
                | ']'
                | '('
                | ')'
                | '#'
                | '+'
                | '-'
                | '.'
                | '!'
                | '|'
                | '~'
                | ':'
                | '@'
                | '='
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Markdown code span holding `s` literally, safe in a table cell too.
pub fn markdown_code(s: &str) -> String {
    if s.is_empty() {
        return "` `".into();
    }
    code_span(&terminal(s).replace('|', "\\|"))
}

/// The pieces of the report's inline markup: code spans (read as CommonMark reads them: a run
/// of backticks opens one, which the next run of exactly as many closes), `**` and `*` toggles,
/// backslash-escaped markup characters (`` \` ``, `\*`, `\\`: text), and text. Both renderings
/// read it the same way. A string from a trace enters the markup only through [`report_code`]
/// or [`report_text`], so it can neither close the span it sits in nor open bold or emphasis.
enum Piece<'a> {
    Code(&'a str),
    Bold,
    Em,
    Char(char),
}

fn pieces(s: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = s;
    // Backticks of a run that closes no span: text.
    let mut literal = 0;
    std::iter::from_fn(move || {
        if literal > 0 {
            literal -= 1;
            return Some(Piece::Char('`'));
        }
        let c = rest.chars().next()?;
        if c == '`' {
            let n = rest.len() - rest.trim_start_matches('`').len();
            let body = &rest[n..];
            // The next run of exactly `n` backticks.
            let mut at = 0;
            while let Some(i) = body[at..].find('`') {
                let start = at + i;
                let len = body[start..].len() - body[start..].trim_start_matches('`').len();
                if len == n {
                    let code = &body[..start];
                    rest = &body[start + n..];
                    // CommonMark strips one space from each side when both have one.
                    let code = match code.strip_prefix(' ').and_then(|c| c.strip_suffix(' ')) {
                        Some(inner) if !code.trim().is_empty() => inner,
                        _ => code,
                    };
                    return Some(Piece::Code(code));
                }
                at = start + len;
            }
            // No closing run: the whole run is text.
            rest = body;
            literal = n - 1;
            return Some(Piece::Char('`'));
        }
        if c == '\\' {
            if let Some(e @ ('`' | '*' | '\\')) = rest[1..].chars().next() {
                rest = &rest[2..];
                return Some(Piece::Char(e));
            }
        }
        if let Some(r) = rest.strip_prefix("**") {
            rest = r;
            return Some(Piece::Bold);
        }
        rest = &rest[c.len_utf8()..];
        Some(if c == '*' { Piece::Em } else { Piece::Char(c) })
    })
}

/// A string from a trace as a code span of the report's inline markup, which nothing in it can
/// close: its fence is longer than any run of backticks inside.
pub fn report_code(s: &str) -> String {
    if s.is_empty() {
        return "` `".into();
    }
    code_span(s)
}

/// A string from a trace as text of the report's inline markup: its backticks, stars and
/// backslashes are escaped, so it opens no code span, bold or emphasis.
pub fn report_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if matches!(c, '`' | '*' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` between backtick fences longer than any backtick run inside (padded with a space where
/// it starts or ends with a backtick, or with a space).
fn code_span(s: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with(['`', ' ']) || s.ends_with(['`', ' ']) { " " } else { "" };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// The report's inline markup as HTML: code spans as `<code>`, `**`/`*` as `<strong>`/`<em>`,
/// every character of text escaped with [`html`].
pub fn report_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let (mut bold, mut em) = (false, false);
    let mut buf = [0u8; 4];
    for p in pieces(s) {
        match p {
            Piece::Code(c) => {
                let _ = write!(out, "<code>{}</code>", html(c));
            }
            Piece::Bold => {
                out.push_str(if bold { "</strong>" } else { "<strong>" });
                bold = !bold;
            }
            Piece::Em => {
                out.push_str(if em { "</em>" } else { "<em>" });
                em = !em;
            }
            Piece::Char(c) => out.push_str(&html(c.encode_utf8(&mut buf))),
        }
    }
    out
}

/// The report's inline markup as plain text, for `summary.json`: a code span gives its content
/// literally, the `**`/`*` toggles are dropped, a backslash-escaped character is the character.
/// Nothing is escaped for any output (JSON escapes what it must): a string from a trace comes
/// out as the trace holds it.
pub fn report_plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for p in pieces(s) {
        match p {
            Piece::Code(c) => out.push_str(c),
            Piece::Bold | Piece::Em => {}
            Piece::Char(c) => out.push(c),
        }
    }
    out
}

/// [`report_plain`] for `#[serde(serialize_with)]`: a field of the report's markup as plain text.
pub fn serialize_report_plain<S: serde::Serializer>(s: &str, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(&report_plain(s))
}

/// The report's inline markup as one line of GitHub Markdown, safe in a paragraph, heading,
/// quote or table cell: code spans stay code spans (their content is literal in Markdown), and
/// a backtick from a trace cannot make a Markdown renderer pair them differently than here,
/// `**`/`*` stay, and text is escaped: HTML as entities, link, code, table and emphasis
/// punctuation with a backslash, control characters as visible escapes.
pub fn report_markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for p in pieces(s) {
        match p {
            // A code span's content is literal in Markdown, and its fence is longer than any
            // backtick run inside; every backtick outside spans is escaped, so a Markdown
            // renderer pairs exactly these spans. Adjacent spans would make longer backtick
            // runs, which pair differently: a space keeps them apart; an empty one is left out.
            Piece::Code("") => {}
            Piece::Code(c) => {
                if out.ends_with('`') {
                    out.push(' ');
                }
                out.push_str(&code_span(&terminal(c).replace('|', "\\|")));
            }
            Piece::Bold => out.push_str("**"),
            Piece::Em => out.push('*'),
            Piece::Char(c) => {
                let first = out.is_empty();
                markdown_char(&mut out, c, first);
            }
        }
    }
    out
}

/// One character of Markdown text, escaped (see [`report_markdown`]).
fn markdown_char(out: &mut String, c: char, line_start: bool) {
    let mut buf = [0u8; 4];
    // Quotes need no entity outside attributes.
    let t = if c == '"' { "\"".into() } else { html(c.encode_utf8(&mut buf)).into_owned() };
    // Prose is wrapped, and a wrapped line of `-` or `=` is a heading's underline (of `-`, `*`
    // or `_` a rule): a `-`, `+` or `=` after another is escaped, which breaks
    // such a run (`out-of-memory` and `a + b` stay as written).
    let run = out.ends_with(['-', '+', '=']);
    let punct = matches!(c, '\\' | '`' | '[' | ']' | '|' | '_' | '~' | '*') || (matches!(c, '-' | '+' | '=') && run);
    // `@` starts a mention or an e-mail link. GitHub finds mentions in the rendered text, where a
    // backslash escape is gone; in a code span of its own it is not text.
    if c == '@' {
        if out.ends_with('`') {
            out.push(' ');
        }
        out.push_str("`@`");
        return;
    }
    // GitHub links `http://`, `https://`, `ftp://`, `mailto:` and `www.` by themselves: an
    // escaped `:` or `.` there leaves text.
    let ends = |w: &str| {
        out.len() >= w.len() && out.is_char_boundary(out.len() - w.len()) && {
            let tail = &out[out.len() - w.len()..];
            tail.eq_ignore_ascii_case(w)
        }
    };
    let autolink =
        (c == ':' && ["http", "https", "ftp", "mailto"].iter().any(|w| ends(w))) || (c == '.' && ends("www"));
    // A line that starts like a heading, list or quote is not one of ours.
    let block = line_start && c == '#';
    if t.len() == 1 && (punct || block || autolink) {
        out.push('\\');
    }
    out.push_str(&t);
}

/// A writer for a terminal (alloctrace's standard output): what passes through keeps its
/// newlines and tabs, but a control character can never reach the terminal raw, whichever
/// command printed it. C0 controls, ESC and DEL become `\x1b`-style escapes; C1 controls and
/// bidirectional overrides become `\u0085`-style escapes, which are also valid inside a JSON
/// string (serde_json already escapes C0 there), so `--json` output stays valid JSON.
///
/// Line structure is the printing code's business: a string that must stay on one line goes
/// through [`terminal`] where it is formatted.
pub struct TerminalWriter<W: std::io::Write> {
    inner: W,
    /// The start of a UTF-8 sequence cut by the end of the last write.
    pending: Vec<u8>,
}

impl<W: std::io::Write> TerminalWriter<W> {
    pub fn new(inner: W) -> Self {
        TerminalWriter { inner, pending: Vec::new() }
    }

    /// Writes `buf` (whole sequences only), escaped; returns the bytes of a sequence cut at
    /// its end, for the next write.
    fn put(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut start = 0;
        let mut i = 0;
        while i < buf.len() {
            // Nearly every byte passes as it is: skip to the next one that may not, in a tight
            // loop (a dump writes gigabytes through here).
            match buf[i..].iter().position(|&b| matches!(b, 0..=0x08 | 0x0b..=0x1f | 0x7f | 0xc2 | 0xe2)) {
                Some(k) => i += k,
                None => {
                    i = buf.len();
                    break;
                }
            }
            let b = buf[i];
            let (len, escape): (usize, Option<String>) = match b {
                b'\n' | b'\t' => (1, None),
                0..=0x1f | 0x7f => (1, Some(format!("\\x{b:02x}"))),
                0xc2 | 0xe2 => {
                    let need = if b == 0xc2 { 2 } else { 3 };
                    if i + need > buf.len() {
                        break;
                    }
                    let cp = std::str::from_utf8(&buf[i..i + need]).ok().and_then(|s| s.chars().next());
                    match cp {
                        Some(c) if is_unsafe(c) => (need, Some(format!("\\u{:04x}", c as u32))),
                        _ => (1, None),
                    }
                }
                _ => (1, None),
            };
            if let Some(e) = escape {
                self.inner.write_all(&buf[start..i])?;
                self.inner.write_all(e.as_bytes())?;
                start = i + len;
            }
            i += len;
        }
        self.inner.write_all(&buf[start..i])?;
        Ok(i)
    }
}

impl<W: std::io::Write> std::io::Write for TerminalWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.pending.is_empty() {
            let mut joined = std::mem::take(&mut self.pending);
            joined.extend_from_slice(buf);
            let done = self.put(&joined)?;
            self.pending = joined[done..].to_vec();
            return Ok(buf.len());
        }
        let done = self.put(buf)?;
        self.pending.extend_from_slice(&buf[done..]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.pending);
        self.inner.write_all(&rest)?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "a`b\n# H\r\x1b[31mred\x1b[0m <img src=x onerror=alert(1)> [l](http://x) |c| \u{202e}rev\x07";

    #[test]
    fn terminal_shows_controls_as_escapes() {
        assert_eq!(terminal("plain text ok"), "plain text ok");
        // A tab would move what follows to another column.
        assert_eq!(terminal("a\tb"), "a\\tb");
        // Escaping twice is escaping once.
        assert_eq!(terminal(&terminal(HOSTILE)), terminal(HOSTILE));
        let t = terminal(HOSTILE);
        assert!(!t.chars().any(is_unsafe), "{t}");
        assert!(t.contains("a`b\\n# H\\r\\x1b[31mred\\x1b[0m") && t.contains("\\u{202e}rev\\x07"), "{t}");
        assert_eq!(terminal("\u{85}\u{7f}"), "\\x85\\x7f");
    }

    #[test]
    fn html_and_xml_leave_no_markup_or_invalid_characters() {
        let h = html(HOSTILE);
        assert!(!h.contains('<') && !h.contains('>') && !h.chars().any(is_unsafe), "{h}");
        assert!(h.contains("&lt;img src=x onerror=alert(1)&gt;"), "{h}");
        assert_eq!(html("\"'&"), "&quot;'&amp;");
        assert_eq!(xml("a\u{1}b"), "a\\x01b");
    }

    #[test]
    fn markdown_text_cannot_open_markup_or_leave_its_line() {
        let m = markdown(HOSTILE);
        assert!(!m.contains('\n') && !m.contains('<'), "{m}");
        assert!(m.contains("a\\`b\\\\n\\# H") && m.contains("\\[l\\]\\(http\\://x\\)") && m.contains("\\|c\\|"), "{m}");
    }

    #[test]
    fn report_markup_keeps_ours_and_escapes_theirs() {
        assert_eq!(report_html("**a** `x<y` *b* c&d"), "<strong>a</strong> <code>x&lt;y</code> <em>b</em> c&amp;d");
        assert_eq!(report_markdown("**a** `x<y|z*` *b* c&d_e"), "**a** `x<y\\|z*` *b* c&amp;d\\_e");
        // Code spans pair as CommonMark pairs them; a run that closes nothing is text.
        assert_eq!(report_markdown("`a``b` ``"), "```a``b``` \\`\\`");
        assert_eq!(report_html("`a``b` ``"), "<code>a``b</code> ``");
        // A command line from a trace that closes the span it was put in.
        let cmd = format!("`{}`", "python a.py` <img src=x onerror=alert(1)> [x](http://e) `y\n# h");
        for out in [report_markdown(&cmd), report_html(&cmd)] {
            assert!(!out.contains("<img") && !out.contains('\n') && !out.contains('\x1b'), "{out}");
        }
        let md = report_markdown(&cmd);
        assert_eq!(md, "`python a.py` &lt;img src=x onerror=alert(1)&gt; \\[x\\](http\\://e) `y\\n# h`");
        assert_eq!(report_markdown("# not a heading"), "\\# not a heading");
    }

    /// A trace string that closes the span the report put it in, then opens bold and
    /// emphasis: it stays inside its span; as text, its stars and backticks are escaped.
    #[test]
    fn a_trace_string_closes_no_span_and_opens_no_emphasis() {
        let name = "f` **BOLD** *em* `g";
        let line = format!("**Fix:** try {} or {}. *Evidence:* x.", report_code(name), report_text(name));
        assert_eq!(
            report_markdown(&line),
            "**Fix:** try ``f` **BOLD** *em* `g`` or f\\` \\*\\*BOLD\\*\\* \\*em\\* \\`g. *Evidence:* x."
        );
        assert_eq!(
            report_html(&line),
            "<strong>Fix:</strong> try <code>f` **BOLD** *em* `g</code> or f` **BOLD** *em* `g. <em>Evidence:</em> x."
        );
        assert_eq!(report_code("`x"), "`` `x ``");
        assert_eq!(report_html(&report_code(" `x` ")), "<code> `x` </code>");
        assert_eq!(report_code(""), "` `");
        assert_eq!(report_html(&report_text("a\\b\\*")), "a\\b\\*");
    }

    /// The report's markup as plain text: what the markup holds, as a person reads it rendered.
    #[test]
    fn report_plain_drops_the_markup_and_keeps_the_text() {
        assert_eq!(report_plain("**Fix:** set `max_split_size_mb:128` *now*"), "Fix: set max_split_size_mb:128 now");
        assert_eq!(report_plain("a \\` b \\* c \\\\ d"), "a ` b * c \\ d");
        // A run of backticks that closes nothing is text; CommonMark's one space of padding goes.
        assert_eq!(report_plain("`a``b` ``"), "a``b ``");
        assert_eq!(report_plain("`` `x ``"), "`x");
        // A string from a trace, put in as code or as text, comes out as it was, whatever it holds.
        let name = "f`\n\t**B** *e* \\x `g";
        assert_eq!(report_plain(&report_code(name)), name);
        assert_eq!(report_plain(&report_text(name)), name);
        let line = format!("**In this run.** from {} and {}.", report_code(name), report_text(name));
        assert_eq!(report_plain(&line), format!("In this run. from {name} and {name}."));
        // A backslash that escapes nothing stays.
        assert_eq!(report_plain("C:\\dir"), "C:\\dir");
    }

    /// No autolink, mention, list item or setext underline of a trace's survives GitHub's
    /// renderer: the characters that start them are escaped.
    #[test]
    fn links_mentions_and_dash_runs_from_a_trace_stay_text() {
        let md = report_markdown("see https://evil.example/x, www.evil.example, mailto:a@b.c and @team ----");
        assert_eq!(md, "see https\\://evil.example/x, www\\.evil.example, mailto\\:a`@`b.c and `@`team -\\-\\-\\-");
        assert_eq!(report_markdown("`x`@y"), "`x` `@`y");
        assert_eq!(report_markdown("HTTPS://x WWW.y"), "HTTPS\\://x WWW\\.y");
        assert_eq!(report_markdown("a = b ==="), "a = b =\\=\\=");
        assert_eq!(markdown("https://x @y"), "https\\://x \\@y");
    }

    #[test]
    fn invisible_and_non_xml_characters_are_shown_escaped() {
        let s = "a\u{200e}b\u{200f}c\u{2028}d\u{200b}e\u{feff}f\u{e0041}g\u{ad}h\u{fffe}\u{ffff}";
        assert_eq!(
            terminal(s),
            "a\\u{200e}b\\u{200f}c\\u{2028}d\\u{200b}e\\u{feff}f\\u{e0041}g\\xadh\\u{fffe}\\u{ffff}"
        );
        assert!(!xml(s).chars().any(is_unsafe));
    }

    #[test]
    fn the_terminal_writer_lets_no_control_character_through() {
        use std::io::Write;
        let text = "ok\tline\n\x1b]0;title\x07 \u{85}é\u{202e}€\n";
        let expected = "ok\tline\n\\x1b]0;title\\x07 \\u0085é\\u202e€\n";
        // Whole, and cut at every byte (a sequence split between two writes).
        for cut in 0..=text.len() {
            let mut w = TerminalWriter::new(Vec::new());
            w.write_all(&text.as_bytes()[..cut]).unwrap();
            w.write_all(&text.as_bytes()[cut..]).unwrap();
            w.flush().unwrap();
            assert_eq!(String::from_utf8(w.inner).unwrap(), expected, "cut at {cut}");
        }
        let json = serde_json::to_string(&serde_json::json!({ "s": "a\u{85}\u{202e}\x1b" })).unwrap();
        let mut w = TerminalWriter::new(Vec::new());
        w.write_all(json.as_bytes()).unwrap();
        w.flush().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&w.inner).unwrap();
        assert_eq!(v["s"], "a\u{85}\u{202e}\x1b", "JSON stays valid and means the same");
    }

    #[test]
    fn markdown_code_spans_hold_any_backticks() {
        assert_eq!(markdown_code("x"), "`x`");
        assert_eq!(markdown_code("a`b"), "``a`b``");
        assert_eq!(markdown_code("``x"), "``` ``x ```");
        assert_eq!(markdown_code("a|b\nc"), "`a\\|b\\nc`");
        assert_eq!(markdown_code(""), "` `");
    }
}
