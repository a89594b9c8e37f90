//! What the renderers share, below every analysis: the JSON envelope of every `--json` output
//! and of `summary.json` ([`json`]), and the pieces of a report's document ([`document`]).

pub mod document;
pub mod json;
