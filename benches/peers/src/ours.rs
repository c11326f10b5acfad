//! Our crates: `cuda_host_launch`'s completions, `spawn_after` and `host_launch`, on streams made
//! by `cuda_host_launch::Stream`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cuda_host_launch::{CompletionMode, Stream};

use crate::wake::{BoxFuture, Signal};

/// Our crate's threads (`comm` names): the watcher `cuda-hl-watch` and the reaper `cuda-hl-reaper`.
pub const THREADS: &[&str] = &["cuda-hl-"];

/// A future of all work enqueued on `stream` so far, in `mode`.
pub fn completion(stream: &Stream, mode: CompletionMode) -> Result<BoxFuture, String> {
    let completion = mode
        .completion(stream)
        .map_err(|e| format!("{mode:?} completion: {e}"))?;
    Ok(Box::pin(async move {
        completion.await.map_err(|e| format!("completion: {e}"))
    }))
}

/// `spawn_after(stream, closure)`, whose closure resolves the returned future.
pub fn spawn_after(stream: &Stream) -> Result<BoxFuture, String> {
    let signal = Arc::new(Signal::default());
    let fire = Arc::clone(&signal);
    cuda_host_launch::spawn_after(stream, move || fire.fire())
        .map_err(|e| format!("spawn_after: {e}"))?;
    Ok(Signal::future(signal))
}

/// `spawn_after(stream, closure)` whose closure counts one on `done`.
pub fn spawn_counted(stream: &Stream, done: &Arc<AtomicU64>) -> Result<(), String> {
    let done = Arc::clone(done);
    cuda_host_launch::spawn_after(stream, move || {
        done.fetch_add(1, Ordering::Release);
    })
    .map_err(|e| format!("spawn_after: {e}"))
}

/// Enqueues `n` no-op closures with `host_launch`.
pub fn host_launch_noops(stream: &Stream, n: usize) -> Result<(), String> {
    for _ in 0..n {
        cuda_host_launch::host_launch(stream, || {}).map_err(|e| format!("host_launch: {e}"))?;
    }
    Ok(())
}
