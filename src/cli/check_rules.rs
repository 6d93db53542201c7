//! `smelt check-rules`: check fusion rules numerically — each rule's left-hand side and
//! right-hand side on random small instances in the reference interpreter.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use smelt::passes::fusion::{builtin_rules, check_rules, load_rules, CheckOptions, Verdict};

use super::out::outln;
use super::read_text;

/// Arguments of `smelt check-rules`.
#[derive(Args)]
pub struct CheckRulesArgs {
    /// A rule file to check (default: the built-in rules).
    file: Option<PathBuf>,
    /// Seed of the random instances (the check is deterministic for a seed).
    #[arg(long, default_value_t = CheckOptions::default().seed)]
    seed: u64,
    /// Instances to compare per left-hand side of each rule (1 to 10000).
    #[arg(long, default_value_t = CheckOptions::default().instances as u16, value_parser = clap::value_parser!(u16).range(1..=10000))]
    instances: u16,
}

/// Runs `smelt check-rules`; fails (exit status 1) when a rule is unsound.
pub fn main(a: CheckRulesArgs) -> Result<()> {
    let rules = match &a.file {
        Some(path) => {
            let src = read_text(path)?;
            load_rules(&src, &path.display().to_string())
                .map_err(|d| anyhow!("{}", d.render(Some(&src)).trim_end()))?
        }
        None => builtin_rules(),
    };
    let options = CheckOptions {
        seed: a.seed,
        instances: usize::from(a.instances),
        ..CheckOptions::default()
    };
    let checks = check_rules(&rules, &options);
    for c in &checks {
        outln!("{}", c.to_text());
    }
    let unsound: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Unsound)
        .map(|c| c.rule.as_str())
        .collect();
    if !unsound.is_empty() {
        bail!(
            "{} of {} rules are unsound: {}",
            unsound.len(),
            checks.len(),
            unsound.join(", ")
        );
    }
    Ok(())
}
