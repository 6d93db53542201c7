//! Standard output and standard error without panics: `print!` panics when stdout is a
//! full disk or a closed pipe, so every subcommand writes through these functions
//! instead. A failed stdout write becomes an error ([`WriteFailed`]) that ends the
//! command with exit status 1 — quietly for a closed pipe (`smelt opt m.tir | head`),
//! with a message otherwise. Messages to stderr are best effort: there is nowhere left to
//! report a failure to write them.

use std::fmt;
use std::io::{self, Write};

/// A write to standard output failed; `main` turns it into exit status 1.
#[derive(Debug)]
pub struct WriteFailed(pub io::Error);

impl WriteFailed {
    /// Whether the reader went away (a closed pipe), which needs no message.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

impl fmt::Display for WriteFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

impl std::error::Error for WriteFailed {}

/// Writes `args` to standard output and flushes, so a full disk is reported by the
/// write that hit it rather than lost in the flush at exit.
pub fn stdout(args: fmt::Arguments<'_>) -> Result<(), WriteFailed> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(WriteFailed)
}

/// Writes `args` to standard error, ignoring failure (see the module doc).
pub fn stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// `print!` that returns a [`WriteFailed`] error from the enclosing function instead of
/// panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::stdout(format_args!($($arg)*))?
    };
}

/// `println!` that returns a [`WriteFailed`] error from the enclosing function instead
/// of panicking.
macro_rules! outln {
    () => {
        $crate::cli::out::stdout(format_args!("\n"))?
    };
    ($($arg:tt)*) => {
        $crate::cli::out::stdout(format_args!("{}\n", format_args!($($arg)*)))?
    };
}

/// `eprintln!` that never panics (best effort).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` that never panics (best effort).
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::cli::out::stderr(format_args!($($arg)*))
    };
}

pub(crate) use {err, errln, out, outln};
