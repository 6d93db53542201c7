//! Pass infrastructure: the [`Pass`] trait, the context passes report into, the
//! [`PassManager`] that runs a named pipeline (verifying after each pass and optionally
//! handing the module to a dump callback), and the registry of passes by name.

use smelt_ir::diag::{Diagnostic, Diagnostics};
use smelt_ir::graph::Module;

use crate::const_fold::ConstFoldPass;
use crate::dce::DcePass;
use crate::fusion::{FusionOptions, FusionPass, FusionReport};
use crate::layout::LayoutPass;

/// Errors of the passes crate.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A pipeline names a pass that does not exist.
    #[error("unknown pass '{name}' (known passes: {known})")]
    UnknownPass {
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A pass that computes with sizes was given a module with symbolic ones.
    #[error("{0}")]
    SymbolicSizes(String),
    /// Fusion options name a rule that does not exist.
    #[error("unknown fusion rule '{0}'")]
    UnknownRule(String),
    /// A user rule has the name of an existing rule.
    #[error("fusion rule '{0}' is defined twice (user rules must not reuse built-in names)")]
    DuplicateRule(String),
    /// A user rule failed the numerical check (unsound or untested) and unchecked rules
    /// are not allowed (`FusionOptions::allow_unchecked_rules`).
    #[error(
        "{location}: user rule '{rule}' failed the numerical check, so it is not run \
         (fix it, or allow it with --allow-unchecked-rules / \
         FusionOptions::allow_unchecked_rules):\n  {finding}"
    )]
    UncheckedRule {
        /// The rule.
        rule: String,
        /// Where it is defined.
        location: smelt_ir::diag::Location,
        /// What `check-rules` says about it.
        finding: String,
    },
    /// A pass left the module invalid.
    #[error("the module is invalid after pass '{pass}':\n{diagnostics}")]
    Verify {
        /// The pass that ran last.
        pass: String,
        /// What the verifier found.
        diagnostics: Diagnostics,
    },
    /// The input or a computation was rejected with diagnostics.
    #[error(transparent)]
    Diagnostics(#[from] Diagnostics),
    /// A pass broke one of its own invariants (a bug in smelt, not in the input).
    #[error("internal error in pass '{pass}': {message}")]
    Internal {
        /// The pass.
        pass: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// What passes report besides the module: warnings and per-pass reports.
#[derive(Clone, Debug, Default)]
pub struct PassContext {
    /// Warnings, in the order they were found.
    pub warnings: Vec<Diagnostic>,
    /// One report per function fused.
    pub fusion_reports: Vec<FusionReport>,
    /// Weights materialized by constant folding (count over the run).
    pub folded_consts: usize,
    /// Instructions and weights removed by dead-code elimination (counts over the run).
    pub dce_removed: (usize, usize),
    /// Each pass run, in order, with its wall time in milliseconds (the check of the
    /// module after it included), for compile-time reports.
    pub pass_ms: Vec<(&'static str, f64)>,
}

/// A transformation of a module.
pub trait Pass {
    /// The name used in pipelines (`--passes fusion,const_fold,dce`).
    fn name(&self) -> &'static str;
    /// Transforms `module`, reporting into `cx`.
    fn run(&self, module: &mut Module, cx: &mut PassContext) -> Result<(), PassError>;
    /// Whether it may run on a function with symbolic sizes (issue #23): only passes
    /// that read no size say so; the others refuse such a module before running.
    fn takes_symbolic_sizes(&self) -> bool {
        false
    }
}

/// Names of every registered pass.
pub const PASS_NAMES: &[&str] = &["fusion", "const_fold", "dce", "layout"];

/// The default pipeline.
pub const DEFAULT_PIPELINE: &[&str] = &["fusion", "const_fold", "dce"];

/// The pass called `name`, with default options.
pub fn pass_by_name(name: &str) -> Option<Box<dyn Pass>> {
    pass_by_name_with(name, &FusionOptions::default())
}

/// The pass called `name`; fusion gets `fusion` as its options.
pub fn pass_by_name_with(name: &str, fusion: &FusionOptions) -> Option<Box<dyn Pass>> {
    match name {
        "fusion" => Some(Box::new(FusionPass {
            options: fusion.clone(),
        })),
        "const_fold" => Some(Box::new(ConstFoldPass)),
        "dce" => Some(Box::new(DcePass)),
        "layout" => Some(Box::new(LayoutPass::default())),
        _ => None,
    }
}

/// A module-level check run after each pass: warnings when valid, errors otherwise
/// ([`smelt_ir::verify::verify_module`] by default).
pub type Verifier = fn(&Module) -> Result<Vec<Diagnostic>, Diagnostics>;

/// A callback receiving `(pass_name, module)` after each pass.
pub type DumpFn<'a> = Box<dyn FnMut(&str, &Module) + 'a>;

/// Runs passes in order, verifying after each and optionally dumping the module.
pub struct PassManager<'a> {
    passes: Vec<Box<dyn Pass>>,
    verifier: Option<Verifier>,
    dump: Option<DumpFn<'a>>,
}

impl Default for PassManager<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> PassManager<'a> {
    /// An empty pipeline that verifies the module after every pass.
    pub fn new() -> Self {
        PassManager {
            passes: Vec::new(),
            verifier: Some(smelt_ir::verify::verify_module),
            dump: None,
        }
    }

    /// The pipeline named by `names` (e.g. from `--passes fusion,dce`).
    pub fn from_names<S: AsRef<str>>(
        names: &[S],
        fusion: &FusionOptions,
    ) -> Result<Self, PassError> {
        let mut pm = PassManager::new();
        for n in names {
            let n = n.as_ref().trim();
            let pass = pass_by_name_with(n, fusion).ok_or_else(|| PassError::UnknownPass {
                name: n.to_string(),
                known: PASS_NAMES.join(", "),
            })?;
            pm.passes.push(pass);
        }
        Ok(pm)
    }

    /// The default pipeline `fusion, const_fold, dce`.
    pub fn default_pipeline(fusion: &FusionOptions) -> Self {
        Self::from_names(DEFAULT_PIPELINE, fusion).expect("default passes are registered")
    }

    /// Appends a pass.
    pub fn add(&mut self, pass: Box<dyn Pass>) {
        self.passes.push(pass);
    }

    /// Replaces the check run after each pass (`None` disables it).
    pub fn set_verifier(&mut self, verifier: Option<Verifier>) {
        self.verifier = verifier;
    }

    /// Calls `dump(pass_name, module)` after each pass (after verification).
    pub fn set_dump(&mut self, dump: impl FnMut(&str, &Module) + 'a) {
        self.dump = Some(Box::new(dump));
    }

    /// The pipeline's pass names, in order.
    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass in order.
    /// The fusion reports this run adds get the op counts of the final module as their
    /// `ops_after`, so they describe the whole pipeline's result.
    pub fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), PassError> {
        let first_report = cx.fusion_reports.len();
        for pass in &self.passes {
            let start = std::time::Instant::now();
            if let (false, Some(f)) = (pass.takes_symbolic_sizes(), module.symbolic_func()) {
                return Err(PassError::SymbolicSizes(
                    smelt_ir::symbolic::needs_known_sizes(&format!("the {} pass", pass.name()), f),
                ));
            }
            pass.run(module, cx)?;
            if let Some(verify) = self.verifier {
                verify(module).map_err(|diagnostics| PassError::Verify {
                    pass: pass.name().to_string(),
                    diagnostics,
                })?;
            }
            cx.pass_ms
                .push((pass.name(), start.elapsed().as_secs_f64() * 1e3));
            if let Some(dump) = self.dump.as_mut() {
                dump(pass.name(), module);
            }
        }
        for report in &mut cx.fusion_reports[first_report..] {
            if let Some(func) = module.funcs.iter().find(|f| f.name == report.func) {
                report.ops_after = crate::fusion::op_counts(func);
            }
        }
        Ok(())
    }
}
