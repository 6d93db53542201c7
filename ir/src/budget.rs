//! The memory budget: one bound on the bytes a model may make smelt hold at once —
//! weights as loaded, constants const_fold materializes, the run-time arena — checked
//! where each size is known and before the memory is allocated, so a small file that
//! asks for much (a splat of a billion elements, thirty 1 GiB constants) gets an error
//! naming what asked and how much, instead of exhausting the machine.
//!
//! The default, [`default_memory_budget`], is half the machine's physical memory, and at
//! most half the process's address-space limit when one is set (`ulimit -v`), so the
//! budget fails first. Callers raise or lower it with `LoadOptions::memory_budget`
//! (Rust), `SmeltOptions.memory_budget` (C) or `--memory-budget` (CLI).

use std::sync::OnceLock;

/// Used when the machine's memory cannot be read: 8 GiB.
const FALLBACK_BYTES: u64 = 8 << 30;

/// The default budget in bytes (see the module doc); computed once per process.
pub fn default_memory_budget() -> u64 {
    static BUDGET: OnceLock<u64> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let physical = physical_memory().unwrap_or(2 * FALLBACK_BYTES);
        let limit = address_space_limit().unwrap_or(u64::MAX);
        (physical / 2).min(limit / 2).max(1 << 20)
    })
}

// Read from /proc rather than through libc, so smelt-ir keeps its one unsafe module.
#[cfg(target_os = "linux")]
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(target_os = "linux")]
fn address_space_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    // "Max address space  <soft> <hard> bytes": the soft limit, or "unlimited"
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn physical_memory() -> Option<u64> {
    None
}

#[cfg(not(target_os = "linux"))]
fn address_space_limit() -> Option<u64> {
    None
}

/// `bytes` in the unit a person reads (`1.5 GiB`), for budget errors.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let (mut v, mut unit) = (bytes as f64 / 1024.0, UNITS[0]);
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit} ({bytes} bytes)")
}

/// The error of a request that does not fit: `what` (naming the node or weight) asks
/// for `bytes` more while `used` are held, over `budget`.
pub fn over_budget(what: &str, bytes: u64, used: u64, budget: u64) -> String {
    format!(
        "{what} needs {} more, with {} already held: over the memory budget of {}; \
         raise it with --memory-budget (CLI), LoadOptions::memory_budget or \
         WeightStore::set_memory_budget (Rust), or SmeltOptions.memory_budget (C)",
        show_bytes(bytes),
        show_bytes(used),
        show_bytes(budget)
    )
}

/// Checks that `bytes` more fit beside `used` within `budget`.
pub fn check(what: &str, bytes: u64, used: u64, budget: u64) -> Result<(), String> {
    match used.checked_add(bytes) {
        Some(total) if total <= budget => Ok(()),
        _ => Err(over_budget(what, bytes, used, budget)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_fits_the_machine_and_errors_say_how_much() {
        assert!(default_memory_budget() >= 1 << 20);
        assert!(check("x", 10, 10, 20).is_ok());
        let e = check("weight @w", 3 << 30, 1 << 30, 2 << 30).unwrap_err();
        assert!(e.contains("weight @w needs 3.0 GiB"), "{e}");
        assert!(check("x", u64::MAX, 1, u64::MAX).is_err());
    }
}
