//! The runtime: `Executable` (code, weights, memory plan) and its checked `run`.
