//! The environment's knobs: how many samples, repetitions and items, and which sections run.

use std::time::Duration;

/// Which sections run (`PEERS_ONLY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Latency,
    Throughput,
    Host,
}

/// Everything the run reads from the environment, read once at start.
#[derive(Debug, Clone)]
pub struct Knobs {
    /// Samples per latency row at the 50 µs and 2 ms holds, over all repetitions (`PEERS_SAMPLES`).
    pub samples: usize,
    /// Samples per latency row at the 20 ms hold, over all repetitions (`PEERS_SAMPLES_LONG`).
    pub samples_long: usize,
    /// Repetitions; the libraries take turns within each (`PEERS_REPS`).
    pub reps: usize,
    /// Items per stream in the 64-stream throughput rows (`PEERS_ITEMS`).
    pub items_per_stream: usize,
    /// Items per thread in the 8 threads × 8 streams row (`PEERS_THREAD_ITEMS`).
    pub items_per_thread: usize,
    /// No-op host functions per method and repetition (`PEERS_HOST_N`).
    pub host_functions: usize,
    /// The holds of the latency rows (`PEERS_HOLDS_US`, comma-separated µs).
    pub holds: Vec<Duration>,
    /// `PEERS_ONLY=latency|throughput|host` (comma-separated); all when unset.
    pub sections: Vec<Section>,
    /// `PEERS_WAITS=1`: sample where the 8 × 8 row's enqueuing threads wait (`waits.rs`), and
    /// report the busiest threads of the host-function rows.
    pub waits: bool,
}

impl Knobs {
    /// Reads the knobs; an unparsable value is an error, never a silent default.
    pub fn from_env() -> Result<Knobs, String> {
        let sections = match std::env::var("PEERS_ONLY") {
            Ok(list) => list
                .split(',')
                .map(|s| match s.trim() {
                    "latency" => Ok(Section::Latency),
                    "throughput" => Ok(Section::Throughput),
                    "host" => Ok(Section::Host),
                    other => Err(format!(
                        "PEERS_ONLY: `{other}` is none of latency, throughput, host"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Err(_) => vec![Section::Latency, Section::Throughput, Section::Host],
        };
        let holds = match std::env::var("PEERS_HOLDS_US") {
            Ok(list) => list
                .split(',')
                .map(|s| {
                    s.trim()
                        .parse::<u64>()
                        .map(Duration::from_micros)
                        .map_err(|e| format!("PEERS_HOLDS_US: `{s}`: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Err(_) => vec![
                Duration::from_micros(50),
                Duration::from_millis(2),
                Duration::from_millis(20),
            ],
        };
        let knobs = Knobs {
            samples: number("PEERS_SAMPLES", 2000)?,
            samples_long: number("PEERS_SAMPLES_LONG", 60)?,
            reps: number("PEERS_REPS", 5)?,
            items_per_stream: number("PEERS_ITEMS", 1000)?,
            items_per_thread: number("PEERS_THREAD_ITEMS", 25_000)?,
            host_functions: number("PEERS_HOST_N", 200_000)?,
            holds,
            sections,
            waits: number("PEERS_WAITS", 0)? != 0,
        };
        if knobs.reps == 0 {
            return Err("PEERS_REPS must be at least 1".into());
        }
        Ok(knobs)
    }

    /// Samples per repetition of a latency row at `hold` (holds of 10 ms and more take the long count).
    pub fn samples_per_rep(&self, hold: Duration) -> usize {
        let total = if hold >= Duration::from_millis(10) {
            self.samples_long
        } else {
            self.samples
        };
        total.div_ceil(self.reps).max(1)
    }

    /// Whether `section` runs.
    pub fn runs(&self, section: Section) -> bool {
        self.sections.contains(&section)
    }
}

fn number(name: &str, default: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|e| format!("{name}: `{v}`: {e}")),
        Err(_) => Ok(default),
    }
}
