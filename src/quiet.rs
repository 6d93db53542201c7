//! A quiet library: panics inside smelt's C entry points and pool workers print nothing.
//!
//! The default panic hook writes the message (and, with `RUST_BACKTRACE`, a backtrace) to
//! stderr before `catch_unwind` can catch the panic, so a host process embedding smelt
//! would see smelt's text in its own stderr. [`quietly`] installs, once, a hook that
//! wraps the host's previous one: while the current thread is inside smelt (a C API call
//! running under `quietly`, or one of smelt's pool workers) it stays silent — the panic
//! is caught and reported through the API, as `SMELT_STATUS_INTERNAL` with its message —
//! and otherwise it calls the previous hook unchanged.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `try_with`: during thread teardown the flag may be gone; then defer to the host
            if !INSIDE.try_with(Cell::get).unwrap_or(false) {
                previous(info);
            }
        }));
    });
}

/// Restores the thread's flag when `quietly`'s body returns or unwinds.
struct Restore(bool);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|f| f.set(self.0));
    }
}

/// Runs `body` with panics silent on this thread (see the module doc); the caller
/// catches them.
pub(crate) fn quietly<R>(body: impl FnOnce() -> R) -> R {
    install();
    let previous = INSIDE.try_with(|f| f.replace(true)).unwrap_or(false);
    let _restore = Restore(previous);
    body()
}

/// Marks the current thread as smelt's own for its lifetime (the pool's workers).
pub(crate) fn mark_thread_as_smelts() {
    install();
    let _ = INSIDE.try_with(|f| f.set(true));
}
