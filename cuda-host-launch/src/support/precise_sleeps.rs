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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The calling thread's timer slack becomes 1 µs (Linux's default is 50 µs).
    #[test]
    fn a_thread_asks_for_a_timer_slack_of_one_microsecond() {
        let slack = std::thread::spawn(|| {
            super::precise_sleeps();
            // SAFETY: PR_GET_TIMERSLACK takes no argument and returns this thread's slack.
            unsafe { libc::prctl(libc::PR_GET_TIMERSLACK) }
        })
        .join()
        .unwrap();
        assert_eq!(slack, 1000);
    }
}
