//! Host functions: N no-op host functions on one stream, items per second from the first enqueue
//! to the end of the stream's synchronize.

use std::time::Instant;

use crate::cpu::{Snapshot, Used};

/// Enqueue time per item and items per second.
#[derive(Debug, Clone, Copy)]
pub struct HostRate {
    pub enqueue_ns: f64,
    pub per_second: f64,
    pub cpu: Used,
}

/// Runs `enqueue(n)` then `sync()`.
pub fn measure(
    n: usize,
    enqueue: &dyn Fn(usize) -> Result<(), String>,
    sync: &dyn Fn() -> Result<(), String>,
    threads: &[&str],
) -> Result<HostRate, String> {
    let before = Snapshot::take();
    let started = Instant::now();
    enqueue(n)?;
    let enqueued = started.elapsed();
    sync()?;
    let elapsed = started.elapsed();
    let cpu = before.used_until(&Snapshot::take(), threads);
    Ok(HostRate {
        enqueue_ns: enqueued.as_nanos() as f64 / n as f64,
        per_second: n as f64 / elapsed.as_secs_f64(),
        cpu,
    })
}
