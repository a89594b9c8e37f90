//! The JSON envelope: every `--json` output and `summary.json` is one object whose first key is
//! `schema_version` (see docs/json-schema.md).

/// The version of every `--json` output and of `summary.json` (see docs/json-schema.md).
pub const SCHEMA_VERSION: u32 = 1;

/// A JSON document: `schema_version` first, then the value's own fields.
#[derive(serde::Serialize)]
pub struct V1<'a, T: serde::Serialize> {
    pub schema_version: u32,
    #[serde(flatten)]
    pub body: &'a T,
}

impl<'a, T: serde::Serialize> V1<'a, T> {
    pub fn of(body: &'a T) -> Self {
        V1 { schema_version: SCHEMA_VERSION, body }
    }
}

/// Prints a JSON value in its envelope, pretty, with a trailing newline.
pub fn write_json(out: &mut dyn std::io::Write, value: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &V1::of(value))?;
    writeln!(out)?;
    Ok(())
}
