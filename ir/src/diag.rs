//! Diagnostics: the one error/warning type every stage reports with, and its rendering.

use std::fmt;
use std::sync::Arc;

/// Where an op or a diagnostic comes from, in the user's terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Location {
    /// Nothing known (ops built by passes without a source op).
    #[default]
    Unknown,
    /// A position in a text file, 1-based.
    File {
        /// File name as given by the user.
        file: Arc<str>,
        /// Line, from 1.
        line: u32,
        /// Column in characters, from 1.
        col: u32,
    },
    /// A node of an imported model (the ONNX node name).
    Name(Arc<str>),
    /// The locations of every op merged into one (a fused op), in program order. Shared:
    /// every kernel step of a fused op carries its location, and a fused op of thousands
    /// of ops lowers to hundreds of steps.
    Fused(Arc<[Location]>),
}

impl Location {
    /// A file position.
    pub fn file(file: &str, line: u32, col: u32) -> Location {
        Location::File {
            file: file.into(),
            line,
            col,
        }
    }

    /// Merges locations into one fused location, flattening nested fusions and
    /// dropping unknowns and duplicates (keeping first-seen order).
    pub fn fuse(parts: impl IntoIterator<Item = Location>) -> Location {
        let mut out: Vec<Location> = Vec::new();
        // a set beside the list: `contains` on the list made merging n ops O(n²)
        let mut seen: std::collections::HashSet<Location> = std::collections::HashSet::new();
        let mut keep = |l: Location| {
            if seen.insert(l.clone()) {
                out.push(l);
            }
        };
        for p in parts {
            match p {
                Location::Fused(v) => v.iter().cloned().for_each(&mut keep),
                Location::Unknown => {}
                other => keep(other),
            }
        }
        match out.len() {
            0 => Location::Unknown,
            1 => out.pop().expect("one element"),
            _ => Location::Fused(out.into()),
        }
    }
}

impl fmt::Display for Location {
    /// The text form used by `loc(...)`: `"file":3:8`, `"node_name"`, `fused["a", "b"]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Unknown => f.write_str("unknown"),
            Location::File { file, line, col } => write!(f, "{}:{line}:{col}", quote(file)),
            Location::Name(n) => f.write_str(&quote(n)),
            Location::Fused(parts) => {
                f.write_str("fused[")?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// A location serializes as its text form (what `loc(...)` prints), so reports in JSON
/// name places exactly as the printed IR and diagnostics do.
impl serde::Serialize for Location {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Quotes a string for the text form, escaping `"` and `\` and non-printing characters.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// The input is rejected.
    Error,
    /// The input is accepted; something deserves attention.
    Warning,
}

/// A message about the user's input: a stable code, what is wrong, where, and notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Stable machine-readable code, e.g. `parse-error`, `type-mismatch`, `undefined-value`.
    pub code: &'static str,
    /// One-line description.
    pub message: String,
    /// Where it happened.
    pub location: Location,
    /// Further explanation, one line each.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// An error.
    pub fn error(code: &'static str, message: impl Into<String>, location: Location) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            location,
            notes: Vec::new(),
        }
    }

    /// A warning.
    pub fn warning(
        code: &'static str,
        message: impl Into<String>,
        location: Location,
    ) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, message, location)
        }
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Renders the diagnostic like rustc does: the header, the location, and, when the
    /// location is in `source`, the line with a caret under the column.
    pub fn render(&self, source: Option<&str>) -> String {
        let mut out = format!(
            "{}[{}]: {}\n",
            match self.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            },
            self.code,
            self.message
        );
        match (&self.location, source) {
            (Location::File { file, line, col }, Some(src)) => {
                out.push_str(&format!("  --> {file}:{line}:{col}\n"));
                if let Some(text) = src.lines().nth(*line as usize - 1) {
                    let gutter = line.to_string();
                    let pad = " ".repeat(gutter.len());
                    let caret_at: usize = text
                        .chars()
                        .take((*col as usize).saturating_sub(1))
                        .map(|c| if c == '\t' { 4 } else { 1 })
                        .sum();
                    out.push_str(&format!(
                        "{pad} |\n{gutter} | {}\n",
                        text.replace('\t', "    ")
                    ));
                    out.push_str(&format!("{pad} | {}^\n", " ".repeat(caret_at)));
                }
            }
            (Location::File { file, line, col }, None) => {
                out.push_str(&format!("  --> {file}:{line}:{col}\n"));
            }
            (Location::Unknown, _) => {}
            (loc, _) => out.push_str(&format!("  --> at {loc}\n")),
        }
        for n in &self.notes {
            out.push_str(&format!("  = note: {n}\n"));
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(None).trim_end())
    }
}

impl std::error::Error for Diagnostic {}

/// Errors of the IR crate: one or more diagnostics, rendered together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_all(.0))]
pub struct Diagnostics(pub Vec<Diagnostic>);

fn render_all(d: &[Diagnostic]) -> String {
    d.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

impl Diagnostics {
    /// Renders every diagnostic against the source text.
    pub fn render(&self, source: Option<&str>) -> String {
        self.0.iter().map(|d| d.render(source)).collect()
    }
}
