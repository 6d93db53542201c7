//! The verifier: type, shape and SSA checks of modules, reported as diagnostics.
