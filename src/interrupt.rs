//! Ctrl-C during a sweep: the first SIGINT lets the points that are running finish, starts no
//! other, and lets the sweep write its index (the points never started are listed as
//! `not-run`); a second one ends the process at once. The process then ends by SIGINT, as if
//! uncaught, so a shell or batch script sees the interruption.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only async-signal-safe calls here: an atomic, write(2), signal(2), raise(3).
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: restoring the default disposition and re-raising are async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::raise(libc::SIGINT);
        }
        return;
    }
    let message = b"\neptwin: interrupted: the running points finish, no other starts, then the \
index is written (Ctrl-C again stops at once)\n";
    // SAFETY: writes a static buffer to stderr.
    unsafe {
        libc::write(2, message.as_ptr().cast(), message.len());
    }
}

/// Catch SIGINT from now on (see the module documentation).
pub fn catch() {
    // SAFETY: installs a handler that makes only async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
}

/// Whether SIGINT arrived since [`catch`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// End the process by SIGINT (after the sweep's index is written).
pub fn exit_by_sigint() -> ! {
    // SAFETY: the default disposition ends the process; `exit` covers a blocked signal.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::raise(libc::SIGINT);
    }
    std::process::exit(130)
}
