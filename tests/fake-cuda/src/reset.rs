//! Putting the fake's steering back as it was at load (what `fixture`'s guard does when it drops).

use std::sync::atomic::Ordering;

use crate::config::config;
use crate::state::{lock, notify};

/// Puts everything a test can steer back as it was when the fake was loaded: the version, the
/// device count, stub mode and missing symbols as the environment gave them (`FAKE_CUDA_*`), the
/// faults as `FAKE_CUDA_FAIL` asked (counted afresh), no hooks, every variant registered at its
/// own version (`fake_cuda_register_variant_at` undone), every thread's calls counted
/// (`fake_cuda_focus_calls_on_this_thread` off), no hidden capture queries, fresh context handles
/// (`fake_cuda_reuse_context_handles` off), and every hold released. The driver's objects
/// (contexts, streams, memory, sticky errors) and the call counters are left as they are.
///
/// These settings are process-wide: a test that steers the fake while another runs changes what
/// the other sees, so tests that steer it run one at a time (`fake_cuda::fixture` does that).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_reset_steering() {
    config().reset();
    crate::calls::reset_faults();
    crate::hooks::clear();
    crate::proc_address::reset_registrations();
    crate::calls::focus_on_this_thread(false);
    crate::capture::HIDDEN_QUERIES.store(0, Ordering::Release);
    crate::context::REUSE_HANDLES.store(false, Ordering::Release);
    let mut st = lock();
    for released in st.holds.values_mut() {
        *released = true;
    }
    drop(st);
    notify();
}
