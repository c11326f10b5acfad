//! Timer precision for this crate's own threads (the reaper, the pollers), whose short sleeps
//! are part of their latency.

/// Asks Linux to wake the calling thread's sleeps and timed parks within 1 µs of their deadline
/// rather than the default 50 µs slack, so a 20 µs or 50 µs interval is what it says. Elsewhere a
/// no-op. Only for threads of this crate.
pub(crate) fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer (nanoseconds) and only affects this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}
