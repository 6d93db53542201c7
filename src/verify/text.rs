//! The verify report as text: one line per fact, byte-identical across runs with the
//! same inputs.

use std::fmt::Write as _;

use smelt_passes::fusion::FusionSite;

use super::{BisectOutcome, BisectReport, InputSource, PerLayerReport, VerifyReport};

/// An error figure in reports: three significant digits, `inf` and `nan` spelled out.
fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "ok"
    } else {
        "FAIL"
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rule names, comma-separated, user rules marked `(user rule)`.
fn rule_list(rules: &[String], user_rules: &[String]) -> String {
    rules
        .iter()
        .map(|r| {
            if user_rules.contains(r) {
                format!("{r} (user rule)")
            } else {
                r.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn site_line(site: &FusionSite, user_rules: &[String]) -> String {
    let merged: Vec<String> = site.merged.iter().map(|l| l.to_string()).collect();
    format!(
        "{} <- {} [{}]",
        site.op,
        rule_list(&site.rules, user_rules),
        merged.join(", ")
    )
}

impl VerifyReport {
    /// The report as text, byte-identical across runs with the same inputs.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "verify @{} (rtol {:e})", self.func, self.rtol);
        for w in &self.warnings {
            let _ = writeln!(out, "  {w}");
        }
        for i in &self.inputs {
            let source = match &i.source {
                InputSource::Given => "given".to_string(),
                InputSource::Random { seed } => format!("random in [-1, 1], seed {seed}"),
            };
            let _ = writeln!(out, "  input %{}: {} ({source})", i.name, i.ty);
        }
        let _ = writeln!(out, "  fusion sites: {}", self.sites.len());
        for (k, s) in self.sites.iter().enumerate() {
            let _ = writeln!(out, "    {}. {}", k + 1, site_line(s, &self.user_rules));
        }
        if let Some(e) = &self.jit_error {
            let _ = writeln!(out, "  jit(fused): FAIL, could not run: {e}");
        }
        write_outputs(&mut out, &self.outputs, "");
        for r in &self.ranges {
            let _ = writeln!(out, "on random inputs in [-{0}, {0}]:", r.range);
            write_outputs(&mut out, &r.outputs, "  ");
        }
        if let Some(p) = &self.per_layer {
            p.write_text(&mut out, self.rtol, &self.user_rules);
        }
        if let Some(b) = &self.bisect {
            b.write_text(&mut out, &self.user_rules);
        }
        let all = || {
            self.outputs
                .iter()
                .chain(self.ranges.iter().flat_map(|r| &r.outputs))
        };
        let comparisons: usize = all().map(|o| o.comparisons.len()).sum();
        let failed: usize = all()
            .flat_map(|o| &o.comparisons)
            .filter(|c| !c.pass)
            .count();
        let _ = writeln!(
            out,
            "{}: {} of {comparisons} comparisons within rtol {:e}{}",
            if self.passed() { "PASS" } else { "FAIL" },
            comparisons - failed,
            self.rtol,
            match (
                &self.jit_error,
                self.per_layer.as_ref().and_then(|p| p.first_divergence)
            ) {
                (Some(_), _) => "; the JIT did not run",
                (None, Some(_)) => "; an intermediate diverges",
                (None, None) => "",
            }
        );
        out
    }
}

/// Each output's comparisons, one line each, indented by `indent`.
fn write_outputs(out: &mut String, outputs: &[super::OutputCheck], indent: &str) {
    for o in outputs {
        let _ = writeln!(out, "{indent}output {}: {}", o.name, o.ty);
        for c in &o.comparisons {
            let pair = format!("{} vs {}", c.got.label(), c.reference.label());
            let _ = writeln!(
                out,
                "{indent}  {pair:<33} max abs {:>9}  relative {:>9}  RMSE {:>9}  {}",
                sci(c.stats.max_abs),
                sci(c.stats.relative),
                sci(c.stats.rmse),
                verdict(c.pass)
            );
        }
    }
}

/// Nothing for the default inputs in [-1, 1]; else the wider range looked at.
fn range_note(range: f32) -> String {
    if range == 1.0 {
        String::new()
    } else {
        format!(", on random inputs in [-{range}, {range}] where the outputs failed")
    }
}

impl PerLayerReport {
    fn write_text(&self, out: &mut String, rtol: f64, user_rules: &[String]) {
        let _ = writeln!(
            out,
            "per layer: {} compared, {} skipped{}",
            self.layers.len(),
            self.skipped.len(),
            range_note(self.input_range)
        );
        if let Some(note) = &self.jit_note {
            let _ = writeln!(out, "  note: {note}");
        }
        // Compared and skipped values, in program order.
        let mut rows: Vec<(usize, String)> = Vec::new();
        for (k, l) in self.layers.iter().enumerate() {
            let jit = l
                .jit
                .as_ref()
                .map_or_else(|| "-".to_string(), |j| sci(j.relative));
            let marker = if self.first_divergence == Some(k) {
                "  <- first divergence"
            } else {
                ""
            };
            let last = l
                .user_ops
                .last()
                .map_or_else(|| "?".to_string(), |u| u.to_string());
            rows.push((
                l.inst,
                format!(
                    "  %{:<4} {:32} relative interp {:>9}  jit {:>9}  {:4}  = {last}{marker}",
                    l.inst,
                    l.op,
                    sci(l.interp.relative),
                    jit,
                    verdict(l.pass),
                ),
            ));
        }
        for s in &self.skipped {
            rows.push((
                s.inst,
                format!("  %{:<4} {:32} skipped: {}", s.inst, s.op, s.reason),
            ));
        }
        rows.sort_by_key(|(inst, _)| *inst);
        for (_, row) in rows {
            let _ = writeln!(out, "{row}");
        }
        match self.first_divergence.and_then(|k| self.layers.get(k)) {
            Some(l) => {
                let _ = writeln!(
                    out,
                    "first divergence: %{} {} (relative {} > {:e})",
                    l.inst,
                    l.op,
                    sci(l
                        .jit
                        .as_ref()
                        .map_or(l.interp.relative, |j| j.relative.max(l.interp.relative))),
                    rtol
                );
                let _ = writeln!(out, "  user ops: {}", list(&l.user_ops));
                let rules = if l.rules.is_empty() {
                    "none (the op is as the input had it)".to_string()
                } else {
                    rule_list(&l.rules, user_rules)
                };
                let _ = writeln!(out, "  rules:    {rules}");
            }
            None => {
                let _ = writeln!(out, "no intermediate diverges");
            }
        }
    }
}

impl BisectReport {
    fn write_text(&self, out: &mut String, user_rules: &[String]) {
        let _ = writeln!(
            out,
            "bisect over {} fusion sites ({} vs interp(unfused)){}:",
            self.total_sites,
            self.oracle.label(),
            range_note(self.input_range)
        );
        for p in &self.probes {
            let _ = writeln!(
                out,
                "  first {:>4} of {} sites: relative {:>9}  {}",
                p.sites,
                self.total_sites,
                sci(p.relative),
                if p.agree { "agree" } else { "DISAGREE" }
            );
        }
        match &self.outcome {
            BisectOutcome::NotNeeded => {
                let _ = writeln!(out, "  nothing to bisect: fused and unfused agree");
            }
            BisectOutcome::Culprit {
                sites,
                site,
                user_ops,
            } => {
                let _ = writeln!(out, "first bad site: {sites}. {}", site.op);
                let _ = writeln!(out, "  rules:    {}", rule_list(&site.rules, user_rules));
                let _ = writeln!(out, "  user ops: {}", list(user_ops));
            }
            BisectOutcome::WithoutFusion => {
                let _ = writeln!(
                    out,
                    "  the mismatch is there with no fusion site: it comes from another pass or the JIT"
                );
            }
            BisectOutcome::NotReproduced => {
                let _ = writeln!(
                    out,
                    "  limiting fusion sites does not reproduce the mismatch"
                );
            }
            BisectOutcome::Unavailable(why) => {
                let _ = writeln!(out, "  bisection failed: {why}");
            }
        }
    }
}
