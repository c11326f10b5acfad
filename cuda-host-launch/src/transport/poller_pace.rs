//! How this crate's poller threads (the low-latency flags' and the events') wait between rounds,
//! and the CPU time they used ([`poller_cpu_time`]).
//!
//! After news (a completion, or work arriving while nothing was pending) a poller spins for
//! [`PollerSettings::spin`]: a busy core, the lowest latency. Then it parks between rounds, each
//! pause a sixteenth of the time waited since the last news or arrival of work, at least
//! [`PollerSettings::interval`] and at most [`PollerSettings::max_interval`] (and never over a
//! second). A poller that parks for longer than `interval` is woken by new work (the event
//! poller's enqueue wakes it then; the watcher's always does), so every completion is
//! seen at most about 1/16 of its own wait late (or `interval`, or `max_interval`), and a long
//! wait costs few rounds: about 55 in the first 4 ms with the defaults, then one per
//! `max_interval` (4,000 a second).
//!
//! `BENCHMARKS.md` gives the figures behind the defaults (latency against CPU time).
//! With nothing pending a poller parks until new work wakes it, and exits after
//! [`PollerSettings::idle_exit`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) use crate::support::config::PollerSettings;

/// What a poller does after a round in which work stayed pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Look again at once.
    Spin,
    /// Park this long (an unpark ends it early).
    Park(Duration),
}

/// How often a spinning poller counts its CPU time.
const CPU_COUNT_EVERY: Duration = Duration::from_millis(1);

/// The longest pause, whatever the settings say.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// What a poller saw in one round.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Round {
    /// Something completed.
    pub(crate) progress: bool,
    /// New work arrived.
    pub(crate) arrived: bool,
    /// Nothing was pending before this round's arrivals.
    pub(crate) was_idle: bool,
    /// Work is still pending after the round.
    pub(crate) pending: bool,
}

/// One source's clocks: when it last had news, and since when it waits.
pub(crate) struct Pace {
    /// The last news (a completion, or work arriving with nothing pending): it spins after it.
    news: Instant,
    /// The last news or arrival of work: its pauses grow with the time since.
    waiting_since: Instant,
}

impl Pace {
    /// From now.
    pub(crate) fn start() -> Pace {
        let now = Instant::now();
        Pace {
            news: now,
            waiting_since: now,
        }
    }

    /// Takes in what a round at `now` saw, and says how to wait with work pending (`None`:
    /// nothing is pending, the caller parks until woken).
    pub(crate) fn after_round(
        &mut self,
        now: Instant,
        round: Round,
        settings: &PollerSettings,
    ) -> Option<Wait> {
        if round.progress || (round.arrived && round.was_idle) {
            self.news = now;
            self.waiting_since = now;
        } else if round.arrived {
            self.waiting_since = now;
        }
        round.pending.then(|| self.wait(now, settings))
    }

    /// How to wait at `now` with work pending (see the module's docs).
    fn wait(&self, now: Instant, settings: &PollerSettings) -> Wait {
        if now.saturating_duration_since(self.news) < settings.spin {
            return Wait::Spin;
        }
        let waited = now.saturating_duration_since(self.waiting_since);
        Wait::Park(
            (waited / 16)
                .min(settings.max_interval)
                .max(settings.interval)
                .min(LONGEST_PAUSE),
        )
    }
}

/// A watching thread's CPU account, added to [`poller_cpu_time`]: counted (a system call: the
/// thread's CPU clock is not in the vDSO) before each park, and while it spins once a millisecond
/// at most.
pub(crate) struct CpuAccount {
    cpu_start: Duration,
    cpu_counted: Duration,
    /// When the CPU time was last counted.
    counted_at: Instant,
}

impl CpuAccount {
    /// For the calling thread, from now.
    pub(crate) fn start() -> CpuAccount {
        CpuAccount {
            cpu_start: thread_cpu_time(),
            cpu_counted: Duration::ZERO,
            counted_at: Instant::now(),
        }
    }

    /// The thread is about to park (`spinning` false) or to look again at once: counts where due.
    pub(crate) fn before_wait(&mut self, now: Instant, spinning: bool) {
        if !spinning || now.saturating_duration_since(self.counted_at) >= CPU_COUNT_EVERY {
            self.counted_at = now;
            self.count();
        }
    }

    /// Adds the thread's CPU time since the last count to [`poller_cpu_time`].
    pub(crate) fn count(&mut self) {
        let used = thread_cpu_time().saturating_sub(self.cpu_start);
        let new = used.saturating_sub(self.cpu_counted);
        POLLER_CPU_NS.fetch_add(nanos(new), Ordering::Relaxed);
        self.cpu_counted = used;
    }
}

static POLLER_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// `d` in nanoseconds, `u64::MAX` for longer than that holds (`Duration::MAX`).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// CPU time this crate's poller threads (the low-latency flags' and the events') have used so far.
pub fn poller_cpu_time() -> Duration {
    Duration::from_nanos(POLLER_CPU_NS.load(Ordering::Relaxed))
}

/// The calling thread's CPU time (zero where the system cannot tell).
fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;

    const PENDING: Round = Round {
        progress: false,
        arrived: false,
        was_idle: false,
        pending: true,
    };

    #[test]
    fn spins_after_news_then_pauses_grow_with_the_wait_within_bounds() {
        let settings = PollerSettings::DEFAULT;
        let mut pace = Pace::start();
        let t0 = Instant::now();
        let news = Round {
            progress: true,
            ..PENDING
        };
        assert_eq!(pace.after_round(t0, news, &settings), Some(Wait::Spin));
        let at = |micros| pace.wait(t0 + Duration::from_micros(micros), &settings);
        assert_eq!(at(19), Wait::Spin);
        assert_eq!(at(20), Wait::Park(Duration::from_micros(20)));
        assert_eq!(at(320), Wait::Park(Duration::from_micros(20)));
        assert_eq!(at(1_600), Wait::Park(Duration::from_micros(100)));
        assert_eq!(at(4_000), Wait::Park(Duration::from_micros(250)));
        assert_eq!(at(10_000_000), Wait::Park(Duration::from_micros(250)));
        // A clock before the news (another thread's `now`) spins rather than panics.
        let before = t0.checked_sub(Duration::from_millis(1)).unwrap_or(t0);
        assert_eq!(pace.wait(before, &settings), Wait::Spin);
        // Nothing pending: the caller parks until woken.
        let idle = Round {
            pending: false,
            ..PENDING
        };
        assert_eq!(pace.after_round(t0, idle, &settings), None);
    }

    #[test]
    fn work_arriving_restarts_the_pauses_and_after_idle_the_spin() {
        let settings = PollerSettings::DEFAULT;
        let mut pace = Pace::start();
        let t0 = Instant::now();
        let long = t0 + Duration::from_millis(50);
        let news = Round {
            progress: true,
            ..PENDING
        };
        pace.after_round(t0, news, &settings);
        assert_eq!(
            pace.after_round(long, PENDING, &settings),
            Some(Wait::Park(Duration::from_micros(250)))
        );
        // Work arriving while other work is pending: short pauses again, no spin.
        let arrived = Round {
            arrived: true,
            ..PENDING
        };
        assert_eq!(
            pace.after_round(long, arrived, &settings),
            Some(Wait::Park(Duration::from_micros(20)))
        );
        // Work arriving while nothing was pending: news, so it spins.
        let after_idle = Round {
            arrived: true,
            was_idle: true,
            ..PENDING
        };
        let later = long + Duration::from_millis(50);
        assert_eq!(
            pace.after_round(later, after_idle, &settings),
            Some(Wait::Spin)
        );
    }

    /// The thread's CPU time is counted (a system call) before every park, and while spinning
    /// once a millisecond at most. (Mutation testing: with the test reversed or its `||` as `&&`,
    /// it was counted on every spinning round, or not before a park, and every test passed.)
    #[test]
    fn the_cpu_time_is_counted_before_each_park_and_once_a_millisecond_while_spinning() {
        let mut cpu = CpuAccount::start();
        let t0 = cpu.counted_at;
        let micros = Duration::from_micros;
        cpu.before_wait(t0 + micros(10), true);
        assert_eq!(
            cpu.counted_at, t0,
            "counted while spinning within the millisecond"
        );
        let t1 = t0 + CPU_COUNT_EVERY;
        cpu.before_wait(t1, true);
        assert_eq!(
            cpu.counted_at, t1,
            "not counted a millisecond into spinning"
        );
        let t2 = t1 + micros(100);
        cpu.before_wait(t2, false);
        assert_eq!(cpu.counted_at, t2, "not counted before a park");
    }

    #[test]
    fn low_latency_spins_and_queries_without_pause_and_keeps_the_other_defaults() {
        // The documented settings (mutation testing: without its `query_gap`, LOW_LATENCY kept
        // the default 5 µs between queries while spinning).
        let low = PollerSettings::LOW_LATENCY;
        assert_eq!((low.spin, low.query_gap), (Duration::MAX, Duration::ZERO));
        let default = PollerSettings::DEFAULT;
        assert_eq!(
            (low.interval, low.max_interval, low.idle_exit),
            (default.interval, default.max_interval, default.idle_exit)
        );
    }

    #[test]
    fn spinning_without_end_and_bounds_that_cross_or_overflow_do_not_panic() {
        let pace = Pace::start();
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(
            pace.wait(later, &PollerSettings::LOW_LATENCY),
            Wait::Spin,
            "LOW_LATENCY spins while anything is pending"
        );
        let crossed = PollerSettings {
            interval: Duration::from_millis(5),
            max_interval: Duration::from_millis(1),
            ..PollerSettings::DEFAULT
        };
        // The shortest pause wins over a longest pause set below it.
        assert_eq!(
            pace.wait(later, &crossed),
            Wait::Park(Duration::from_millis(5))
        );
        let huge = PollerSettings {
            interval: Duration::MAX,
            max_interval: Duration::MAX,
            ..PollerSettings::DEFAULT
        };
        assert_eq!(pace.wait(later, &huge), Wait::Park(LONGEST_PAUSE));
    }
}
