//! A report's document as a list of blocks, built once and rendered as Markdown and as HTML
//! ([`crate::render::report::Report::blocks`]), its section across ranks included.

/// A piece of the document.
#[derive(Debug, Clone)]
pub enum Block {
    Heading(u8, String),
    /// Text with inline `code` and **bold**.
    Para(String),
    Table(Vec<String>, Vec<Vec<String>>),
    /// A picture by index into `Report::pictures`.
    Picture(usize),
    /// A clearly marked note (a blockquote).
    Note(String),
    /// Preformatted text.
    Code(String),
}
