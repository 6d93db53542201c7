//! smelt-passes
