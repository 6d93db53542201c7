//! `--dump-loops` and `--dump-clif DIR`: the loop IR and the Cranelift IR of a compiled model.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::out::{errln, out};
use anyhow::{Context, Result};
use clap::Args;
use smelt::codegen::{clif_text, TargetDesc};
use smelt::Executable;

/// Switches that show what the JIT compiles.
#[derive(Args, Clone, Debug, Default)]
pub struct DumpArgs {
    /// Print the loop IR of every kernel and the call sequence (stdout).
    #[arg(long)]
    pub dump_loops: bool,
    /// Write the Cranelift IR of every kernel, one KERNEL.clif per kernel, for this host's
    /// instruction set.
    #[arg(long, value_name = "DIR")]
    pub dump_clif: Option<PathBuf>,
}

impl DumpArgs {
    /// Whether any dump was asked for.
    pub fn any(&self) -> bool {
        self.dump_loops || self.dump_clif.is_some()
    }

    /// Dumps what was asked for about `exe`.
    pub fn write(&self, exe: &Executable) -> Result<()> {
        if self.dump_loops {
            out!("{}", exe.dump_loops());
        }
        if let Some(dir) = &self.dump_clif {
            let count = write_clif(exe, dir)?;
            errln!("wrote {count} .clif files to {}", dir.display());
        }
        Ok(())
    }
}

/// Writes one `.clif` file per kernel of `exe` (the kernels it runs, not a second
/// lowering) into `dir`; returns how many.
pub fn write_clif(exe: &Executable, dir: &Path) -> Result<usize> {
    let target = TargetDesc {
        tiles: exe.tile_isa(),
        ..TargetDesc::host()?
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut used = BTreeSet::new();
    for (i, kernel) in exe.kernels().iter().enumerate() {
        let text = clif_text(kernel, &target)?;
        let mut stem = file_stem(&kernel.name);
        if !used.insert(stem.clone()) {
            stem = format!("{stem}-{i}");
            used.insert(stem.clone());
        }
        let path = dir.join(format!("{stem}.clif"));
        let header = format!("; kernel {i}: {}\n", kernel.name);
        std::fs::write(&path, header + &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(exe.kernels().len())
}

/// A file name for a kernel: its name with anything but letters, digits, `_`, `-` and `.`
/// replaced by `_`.
fn file_stem(kernel: &str) -> String {
    let stem: String = kernel
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() || stem.starts_with('.') {
        format!("kernel{stem}")
    } else {
        stem
    }
}
