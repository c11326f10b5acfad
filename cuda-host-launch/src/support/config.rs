//! The crate's one configuration ([`Config`]): who drops the owners, how its threads start and
//! where they run, and how its pollers and its reaper pace themselves. Installed once, before the
//! crate's first use, in the manner of rayon's `ThreadPoolBuilder::build_global`; the first use
//! fixes the defaults (with the environment's overrides) if nothing was installed. Every later
//! [`Config::install`] is refused with [`Error::AlreadyConfigured`]: no setting is silently
//! ignored, and every thread of the crate runs with the same settings from start to end.
//!
//! Environment variables override what the program installed, so that whoever runs a program can
//! change these without building it again:
//!
//! | variable | values | overrides |
//! | --- | --- | --- |
//! | [`CLEANUP_MODE_ENV`] | `reaper`, `manual` | [`Config::cleanup_mode`] |
//! | [`POLLER_ENV`] | `default`, `low-latency` | [`Config::event_poller`] |
//! | [`REAPER_POLL_ENV`] | microseconds | [`Config::reaper_pace`]'s `poll` |
//! | [`REAPER_LINGER_ENV`] | microseconds | [`Config::reaper_pace`]'s `linger` |
//!
//! A value that is not understood is an error ([`Error::InvalidEnvironment`]) from `install`
//! and from every call that needs the configuration, never a silent default.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::error::Error;
use crate::support::thread_settings::ThreadSettings;

/// The environment variable that overrides the cleanup mode: `reaper` or `manual`.
pub const CLEANUP_MODE_ENV: &str = "CUDA_HOST_LAUNCH_CLEANUP";

/// The environment variable that overrides the watcher's pace: `default`
/// ([`PollerSettings::DEFAULT`]) or `low-latency` ([`PollerSettings::LOW_LATENCY`]).
pub const POLLER_ENV: &str = "CUDA_HOST_LAUNCH_POLLER";

/// The environment variable that overrides how often (µs) the reaper looks at its queue while it
/// lingers after a batch (`0`: it parks at once after every batch).
pub const REAPER_POLL_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_POLL_US";

/// The environment variable that overrides how long (µs) the reaper lingers after its last batch
/// before it parks.
pub const REAPER_LINGER_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_LINGER_US";

/// Who drops the owners of host functions that have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupMode {
    /// A background thread (the reaper), started on first use, drops them as soon as they are
    /// queued (the default).
    #[default]
    Reaper,
    /// No thread: they are dropped at the next launch, [`drain`](crate::drain) or
    /// [`flush`](crate::flush), on that caller's thread.
    ///
    /// That thread's stream-capture interaction mode applies to the owners' `Drop`: in the
    /// default (`CU_STREAM_CAPTURE_MODE_GLOBAL`), while any other thread captures a stream in
    /// global mode (or the thread itself captures), a `Drop` that frees or allocates memory, or
    /// queries or synchronizes an event, a stream or a context, fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that capture. So drain (and launch)
    /// from a thread that no such capture affects, or that is in relaxed mode
    /// (`cuThreadExchangeStreamCaptureMode`), or release such owners in reaper mode, whose thread
    /// is relaxed.
    Manual,
}

/// How a poller waits between its looks at pending work.
///
/// After news (a completion, or work arriving while nothing was pending) it spins for
/// [`spin`](Self::spin): a busy core, the lowest latency. Then it parks between rounds, each pause
/// a sixteenth of the time waited since the last news or arrival of work, at least
/// [`interval`](Self::interval) and at most [`max_interval`](Self::max_interval) (and never over a
/// second). New work wakes a parked poller, so every completion is seen at most about 1/16 of its
/// own wait late (or `interval`, or `max_interval`), and a long wait costs few rounds. With
/// nothing pending it parks until new work wakes it, and its thread exits after
/// [`idle_exit`](Self::idle_exit). `BENCHMARKS.md` gives latency and CPU time for each pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollerSettings {
    /// How long the poller spins (looks without pause) after news, while work is pending.
    /// `Duration::MAX`: spin for as long as anything is pending ([`PollerSettings::LOW_LATENCY`]).
    pub spin: Duration,
    /// The shortest pause between two rounds once it stopped spinning.
    pub interval: Duration,
    /// The longest pause between two rounds while work is pending: how late, at most, the poller
    /// sees a completion after a long wait. Pauses never exceed one second, whatever this and
    /// `interval` say.
    pub max_interval: Duration,
    /// How long the poller stays with nothing pending before its thread exits.
    pub idle_exit: Duration,
    /// While it spins, the least time from one round's start to the next's: every query takes the
    /// driver's lock, which every `cuEventRecord` of the process also takes, so a poller querying
    /// without pause slows the enqueues it waits for (`BENCHMARKS.md`). Between rounds it spins
    /// without querying. `ZERO`: query without pause ([`PollerSettings::LOW_LATENCY`]). With
    /// `learned_spin`, no gap inside the window of a lone entry whose work is learned to take 800 µs
    /// or more (its end is expected then, and the window is a small part of the wait).
    pub query_gap: Duration,
    /// Spin near the time each stream's work is expected to complete, learned from its earlier
    /// completions (for repeated work: a training or inference step), instead of pausing through
    /// it: such a completion is seen within microseconds, for a spin of a few percent of the wait
    /// (see `BENCHMARKS.md`). While every stream pending has waits that agree closely (regular
    /// work), the poller looks before the expected time at least every `max_interval` (or
    /// `interval`, if longer), not at the shorter pauses above: a completion earlier than
    /// learned is still seen within that. Unknown or irregular waits keep the pauses above.
    pub learned_spin: bool,
}

impl PollerSettings {
    /// The watcher's defaults: spin 20 µs after news (a round every 5 µs at most), then
    /// pauses from 20 µs to 250 µs, spinning near each stream's learned completion time; exit
    /// after 100 ms idle.
    pub const DEFAULT: PollerSettings = PollerSettings {
        spin: Duration::from_micros(20),
        interval: Duration::from_micros(20),
        max_interval: Duration::from_micros(250),
        idle_exit: Duration::from_millis(100),
        query_gap: Duration::from_micros(5),
        learned_spin: true,
    };

    /// Spin while anything is pending, querying without pause: the lowest latency, a busy core
    /// meanwhile, and enqueues slowed by the queries.
    pub const LOW_LATENCY: PollerSettings = PollerSettings {
        spin: Duration::MAX,
        query_gap: Duration::ZERO,
        ..PollerSettings::DEFAULT
    };
}

impl Default for PollerSettings {
    fn default() -> Self {
        PollerSettings::DEFAULT
    }
}

/// The crate's configuration: build it, then [`install`](Config::install) it once, before the
/// crate's first use (see the module's docs for the environment's overrides).
///
/// ```
/// use std::time::Duration;
/// use cuda_host_launch::{Affinity, CleanupMode, Config, PollerSettings, ThreadSettings};
///
/// Config::new()
///     .cleanup_mode(CleanupMode::Reaper)
///     .threads(ThreadSettings::new().affinity(Affinity::Cpus(vec![1, 2, 3])))
///     .event_poller(PollerSettings::LOW_LATENCY)
///     .install()
///     .expect("installed before the crate's first use");
/// assert_eq!(cuda_host_launch::config().unwrap().cleanup(), CleanupMode::Reaper);
/// // Once in force, it stays: a second install is refused.
/// assert!(Config::new().install().is_err());
/// ```
#[derive(Clone, Debug)]
#[must_use = "a Config does nothing until it is installed"]
pub struct Config {
    cleanup: CleanupMode,
    threads: ThreadSettings,
    event_poller: PollerSettings,
    reaper_poll: Duration,
    reaper_linger: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cleanup: CleanupMode::Reaper,
            threads: ThreadSettings::default(),
            event_poller: PollerSettings::DEFAULT,
            reaper_poll: Duration::from_micros(50),
            reaper_linger: Duration::from_micros(2000),
        }
    }
}

impl Config {
    /// The defaults: [`CleanupMode::Reaper`], [`ThreadSettings::new`], [`PollerSettings::DEFAULT`],
    /// and a reaper that looks every 50 µs for 2 ms after a batch before it parks.
    pub fn new() -> Config {
        Config::default()
    }

    /// Who drops the owners ([`CLEANUP_MODE_ENV`] overrides it).
    pub fn cleanup_mode(mut self, mode: CleanupMode) -> Config {
        self.cleanup = mode;
        self
    }

    /// How the crate's threads (the reaper, the watcher, the watcher) are named,
    /// where they may run, and what each runs as it starts.
    pub fn threads(mut self, threads: ThreadSettings) -> Config {
        self.threads = threads;
        self
    }

    /// How the watcher paces itself ([`POLLER_ENV`] overrides it).
    pub fn event_poller(mut self, settings: PollerSettings) -> Config {
        self.event_poller = settings;
        self
    }

    /// How the reaper waits after a batch: it looks at its queue every `poll` for `linger`, then
    /// parks. While it lingers, a driver thread's push costs no futex wake (`DESIGN.md`, "The
    /// reaper"); `poll` zero parks at once after every batch. ([`REAPER_POLL_ENV`] and
    /// [`REAPER_LINGER_ENV`] override them.)
    pub fn reaper_pace(mut self, poll: Duration, linger: Duration) -> Config {
        self.reaper_poll = poll;
        self.reaper_linger = linger;
        self
    }

    /// Puts this configuration in force for the rest of the process, with the environment's
    /// overrides applied.
    ///
    /// # Errors
    /// - [`Error::AlreadyConfigured`] if a configuration is already in force: installed before,
    ///   or fixed by the crate's first use (a launch, a future, a `flush`, [`config`]). Nothing
    ///   changes then.
    /// - [`Error::InvalidEnvironment`] if an override holds a value that is not understood;
    ///   nothing is installed, and the crate's calls keep answering this error until the
    ///   variable is corrected.
    pub fn install(self) -> Result<(), Error> {
        let config = self.with_overrides().map_err(Error::from)?;
        let mut installed = false;
        let _ = IN_FORCE.get_or_init(|| {
            installed = true;
            Ok(config)
        });
        if installed {
            Ok(())
        } else {
            Err(Error::AlreadyConfigured)
        }
    }

    /// Who drops the owners.
    pub fn cleanup(&self) -> CleanupMode {
        self.cleanup
    }

    /// How the crate's threads start.
    pub fn thread_settings(&self) -> &ThreadSettings {
        &self.threads
    }

    /// How the watcher paces itself.
    pub fn event_poller_settings(&self) -> PollerSettings {
        self.event_poller
    }

    /// How the reaper waits after a batch: `(poll, linger)`.
    pub fn reaper_waits(&self) -> (Duration, Duration) {
        (self.reaper_poll, self.reaper_linger)
    }

    /// This configuration with the environment's overrides applied.
    fn with_overrides(mut self) -> Result<Config, BadVariable> {
        if let Some(value) = read(CLEANUP_MODE_ENV, CLEANUP_VALUES)? {
            self.cleanup = match value.trim().to_ascii_lowercase().as_str() {
                "" | "reaper" => CleanupMode::Reaper,
                "manual" => CleanupMode::Manual,
                _ => return Err(BadVariable::new(CLEANUP_MODE_ENV, value, CLEANUP_VALUES)),
            };
        }
        if let Some(value) = read(POLLER_ENV, POLLER_VALUES)? {
            self.event_poller = match value.trim().to_ascii_lowercase().as_str() {
                "" | "default" => PollerSettings::DEFAULT,
                "low-latency" => PollerSettings::LOW_LATENCY,
                _ => return Err(BadVariable::new(POLLER_ENV, value, POLLER_VALUES)),
            };
        }
        if let Some(poll) = micros(REAPER_POLL_ENV)? {
            self.reaper_poll = poll;
        }
        if let Some(linger) = micros(REAPER_LINGER_ENV)? {
            self.reaper_linger = linger;
        }
        Ok(self)
    }
}

const CLEANUP_VALUES: &str = "`reaper` or `manual`";
const POLLER_VALUES: &str = "`default` or `low-latency`";
const MICROS: &str = "a whole number of microseconds";

/// What is in force: the installed configuration, or the defaults that the first use fixed (an
/// override that was not understood is kept as its error).
static IN_FORCE: OnceLock<Result<Config, BadVariable>> = OnceLock::new();

/// The configuration in force. The first call (this one, or the crate's first use) fixes the
/// defaults with the environment's overrides if nothing was installed.
///
/// # Errors
/// [`Error::InvalidEnvironment`] if an override holds a value that is not understood.
pub fn config() -> Result<&'static Config, Error> {
    IN_FORCE
        .get_or_init(|| Config::default().with_overrides())
        .as_ref()
        .map_err(|bad| Error::from(bad.clone()))
}

/// An override whose value is not understood.
#[derive(Clone, Debug)]
struct BadVariable {
    variable: &'static str,
    value: String,
    expected: &'static str,
}

impl BadVariable {
    fn new(variable: &'static str, value: String, expected: &'static str) -> BadVariable {
        BadVariable {
            variable,
            value,
            expected,
        }
    }
}

impl From<BadVariable> for Error {
    fn from(bad: BadVariable) -> Error {
        Error::InvalidEnvironment {
            variable: bad.variable,
            value: bad.value,
            expected: bad.expected,
        }
    }
}

/// The value of `variable`, `None` if unset.
fn read(variable: &'static str, expected: &'static str) -> Result<Option<String>, BadVariable> {
    match std::env::var(variable) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotUnicode(value)) => Err(BadVariable::new(
            variable,
            value.to_string_lossy().into_owned(),
            expected,
        )),
    }
}

/// A duration in microseconds from `variable`, `None` if unset.
fn micros(variable: &'static str) -> Result<Option<Duration>, BadVariable> {
    match read(variable, MICROS)? {
        None => Ok(None),
        Some(value) => match value.trim().parse::<u64>() {
            Ok(micros) => Ok(Some(Duration::from_micros(micros))),
            Err(_) => Err(BadVariable::new(variable, value, MICROS)),
        },
    }
}
