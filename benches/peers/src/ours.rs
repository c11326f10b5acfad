//! Our crates: `cuda_host_launch`'s completions, `spawn_after` and `host_launch`, on streams made
//! by `cuda_host_launch::Stream`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_host_launch::{CompletionMode, Config, PollerSettings, Stream};

use crate::wake::{BoxFuture, Signal};

/// Our crate's threads (`comm` names): the watcher `cuda-hl-watch` and the reaper `cuda-hl-reaper`.
pub const THREADS: &[&str] = &["cuda-hl-"];

/// Installs the watcher's pace that `PEERS_POLLER` names, for the process (the latency-against-CPU
/// curve runs one process per pace): `default`, `low-latency`, or `key=µs` pairs over the
/// defaults, comma-separated: `spin`, `interval`, `max`, `gap`, `idle` (`PollerSettings`' `spin`,
/// `interval`, `max_interval`, `query_gap`, `idle_exit`) and `learned=0|1`. A long `idle` keeps
/// the event pools (and their events) between the repetitions, so the 8 × 8 row's later
/// repetitions make no events (with the pool's cap on free events raised, see the notebook).
/// Returns the settings in force.
pub fn install_poller_from_env() -> Result<PollerSettings, String> {
    let Ok(text) = std::env::var("PEERS_POLLER") else {
        return Ok(PollerSettings::DEFAULT);
    };
    let mut settings = PollerSettings::DEFAULT;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "default" {
            continue;
        }
        if part == "low-latency" {
            settings = PollerSettings::LOW_LATENCY;
            continue;
        }
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("PEERS_POLLER: `{part}` is not key=value"))?;
        let number: u64 = value
            .trim()
            .parse()
            .map_err(|e| format!("PEERS_POLLER: `{part}`: {e}"))?;
        let micros = Duration::from_micros(number);
        match key.trim() {
            "spin" => settings.spin = micros,
            "interval" => settings.interval = micros,
            "max" => settings.max_interval = micros,
            "gap" => settings.query_gap = micros,
            "idle" => settings.idle_exit = micros,
            "learned" => settings.learned_spin = number != 0,
            other => return Err(format!("PEERS_POLLER: unknown key `{other}`")),
        }
    }
    Config::new()
        .event_poller(settings)
        .install()
        .map_err(|e| format!("PEERS_POLLER: {e}"))?;
    Ok(settings)
}

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

/// Counts one on its counter when dropped.
struct Counted(Arc<AtomicU64>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// `release_after(stream, owner)` whose owner counts one on `done` when dropped.
pub fn release_counted(stream: &Stream, done: &Arc<AtomicU64>) -> Result<(), String> {
    cuda_host_launch::release_after(stream, Counted(Arc::clone(done)))
        .map_err(|e| format!("release_after: {e}"))
}
