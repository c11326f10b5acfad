//! Host functions: N no-op host functions on one stream, items per second from the first enqueue
//! to the end of the stream's synchronize.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cpu::{Snapshot, Used};
use crate::waits::{Sampler, Samples};

/// Enqueue time per item and items per second.
#[derive(Debug, Clone)]
pub struct HostRate {
    pub enqueue_ns: f64,
    pub per_second: f64,
    pub cpu: Used,
    /// The busiest threads over the run, as shares of its wall time.
    pub busy: Vec<(String, f64)>,
    /// What a sampler saw every thread doing (when asked for).
    pub waits: Option<Arc<Samples>>,
}

/// Runs `enqueue(n)` then `sync()`; with `sample`, a [`Sampler`] watches every thread of the
/// process every 200 µs meanwhile.
pub fn measure(
    n: usize,
    enqueue: &dyn Fn(usize) -> Result<(), String>,
    sync: &dyn Fn() -> Result<(), String>,
    threads: &[&str],
    sample: bool,
) -> Result<HostRate, String> {
    let sampler = sample.then(|| Sampler::start(all_threads(), Duration::from_micros(200)));
    let before = Snapshot::take();
    let started = Instant::now();
    enqueue(n)?;
    let enqueued = started.elapsed();
    sync()?;
    let elapsed = started.elapsed();
    let after = Snapshot::take();
    let waits = sampler.map(|s| Arc::new(s.finish()));
    let cpu = before.used_until(&after, threads);
    Ok(HostRate {
        enqueue_ns: enqueued.as_nanos() as f64 / n as f64,
        per_second: n as f64 / elapsed.as_secs_f64(),
        cpu,
        busy: before.busiest(&after, elapsed.as_nanos() as u64, 5),
        waits,
    })
}

/// Every thread of the process now.
fn all_threads() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
