//! `smelt check-rules`: check fusion rules — each rule's left-hand side and right-hand
//! side on random small instances in the reference interpreter, with inputs drawn over
//! several strata (unit, tiny, wide, large, integers, break points, signs), then proved
//! where the ops allow: exactly in one variable, at random rational points for polynomial
//! laws, by the SMT solver `z3` for piecewise-linear ones (the one command that starts it).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use smelt::passes::fusion::{builtin_rules, check_rules, load_rules, CheckOptions, Stratum};

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
    /// The magnitude of the `large` stratum: values uniform in [-X, X].
    #[arg(long, value_name = "X", default_value_t = CheckOptions::default().large)]
    range: f64,
    /// Milliseconds the SMT solver (`z3`) may spend on one query before the rule is left
    /// to sampling (1 to 600000).
    #[arg(long, value_name = "MS", default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=600_000))]
    solver_timeout: u32,
    /// Sample only: start no solver.
    #[arg(long)]
    no_solver: bool,
}

/// Runs `smelt check-rules`; fails (exit status 1) when a rule is unsound or untested.
pub fn main(a: CheckRulesArgs) -> Result<()> {
    if !(a.range.is_finite() && a.range >= 1.0 && a.range <= 1e30) {
        bail!("--range must be a number in [1, 1e30], got {}", a.range);
    }
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
        large: a.range,
        solver_timeout_ms: (!a.no_solver).then_some(a.solver_timeout),
        ..CheckOptions::default()
    };
    let strata: Vec<String> = Stratum::ALL.iter().map(|s| s.describe(&options)).collect();
    let checks = check_rules(&rules, &options);
    let mut out = format!("sampled over: {}\n", strata.join(", "));
    for c in &checks {
        out.push_str(&c.to_text());
        out.push('\n');
    }
    outln!("{}", out.trim_end_matches('\n'));
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.verdict.fails())
        .map(|c| format!("{} ({})", c.rule, c.status()))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} rules failed the check: {}",
            failed.len(),
            checks.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
