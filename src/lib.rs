//! smelt
