//! How long a stream's work usually takes, learned from its completions, so that the event side
//! spins near the time it expects the next one ([`PollerSettings::learned_spin`]) instead of
//! pausing through it. Repeated work (a training or inference step, the same wait each time) is
//! then seen within a few microseconds of its end, for a spin of a few percent of the wait; work
//! of no known length keeps the usual pace (`transport::poller_pace`).
//!
//! - **What is learned.** For each stream (its context and `cuStreamGetId`), `typical`: from an
//!   entry's arrival at the watcher (the round that took it from the hand-over) to the round that
//!   saw its event complete, for the stream's newest entry when it is queried done; each new
//!   sample moves it a quarter of the way. A sample seen late (the side was pausing) is at most a
//!   pause long, and the next one, taken while spinning near the completion, is exact again.
//! - **The window** of a stream's oldest pending entry, arrived at `a`: from
//!   `a + typical − early` to `a + typical + late`, `early` = max(typical / 32, 20 µs), `late` =
//!   max(typical / 16, 50 µs). Inside a window the side spins; a pause ends at the next window's
//!   start; once past a window, the usual pace goes on. So a wait costs at most `early + late` of
//!   spinning more than the usual pace, about a tenth of it, and a repeated one less (the spin
//!   ends at the completion).
//! - At most [`STREAMS`] streams are remembered; beyond that the list starts over.
//!
//! [`PollerSettings::learned_spin`]: crate::PollerSettings::learned_spin

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::context_key::ContextKey;
use crate::support::fast_hash::FastHash;
use crate::transport::poller_pace::Wait;

/// The most streams remembered at once.
pub(super) const STREAMS: usize = 4096;
/// The least spin before the expected completion.
const EARLY: Duration = Duration::from_micros(20);
/// The least spin after it.
const LATE: Duration = Duration::from_micros(50);

/// A stream: its context and `cuStreamGetId`.
pub(super) type StreamKey = (ContextKey, u64);

/// The learned completion time of each stream.
#[derive(Default)]
pub(super) struct LearnedWaits {
    typical: HashMap<StreamKey, Duration, FastHash>,
}

impl LearnedWaits {
    /// A stream's newest entry, arrived `waited` ago, was seen complete now.
    pub(super) fn learn(&mut self, stream: StreamKey, waited: Duration) {
        if self.typical.len() >= STREAMS && !self.typical.contains_key(&stream) {
            self.typical.clear();
        }
        self.typical
            .entry(stream)
            .and_modify(|typical| {
                *typical = if waited >= *typical {
                    *typical + (waited - *typical) / 4
                } else {
                    *typical - (*typical - waited) / 4
                }
            })
            .or_insert(waited);
    }

    /// The window in which the stream's entry that arrived at `arrived` is expected to complete
    /// (`None`: the stream's work has no learned length yet).
    pub(super) fn window(&self, stream: StreamKey, arrived: Instant) -> Option<Window> {
        let typical = *self.typical.get(&stream)?;
        let expected = arrived.checked_add(typical)?;
        let from = expected
            .checked_sub((typical / 32).max(EARLY))
            .unwrap_or(arrived)
            .max(arrived);
        let until = expected.checked_add((typical / 16).max(LATE))?;
        Some(Window { from, until })
    }

    /// The learned length of a stream's work (tests).
    #[cfg(test)]
    pub(super) fn typical(&self, stream: StreamKey) -> Option<Duration> {
        self.typical.get(&stream).copied()
    }
}

/// When a pending entry is expected to complete: the side spins from `from` to `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) from: Instant,
    pub(super) until: Instant,
}

/// The wait after a round at `now`, given the windows of the entries pending: a spin inside one,
/// a pause cut short at the start of the next. A spin, or nothing pending, is left as it is.
pub(super) fn adjust(
    wait: Option<Wait>,
    now: Instant,
    windows: impl IntoIterator<Item = Window>,
) -> Option<Wait> {
    let Some(Wait::Park(mut pause)) = wait else {
        return wait;
    };
    for window in windows {
        if window.from <= now && now < window.until {
            return Some(Wait::Spin);
        }
        if window.from > now {
            pause = pause.min(window.from - now);
        }
    }
    Some(Wait::Park(pause))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: StreamKey = (ContextKey { handle: 1, id: 1 }, 7);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The first sample is the typical length; later ones move it a quarter of the way, up or
    /// down. (Mutation testing: each arithmetic operator here.)
    #[test]
    fn each_sample_moves_the_typical_length_a_quarter_of_the_way() {
        let mut learned = LearnedWaits::default();
        assert_eq!(learned.typical(STREAM), None);
        learned.learn(STREAM, us(2_000));
        assert_eq!(learned.typical(STREAM), Some(us(2_000)));
        learned.learn(STREAM, us(2_400));
        assert_eq!(learned.typical(STREAM), Some(us(2_100)));
        learned.learn(STREAM, us(1_700));
        assert_eq!(learned.typical(STREAM), Some(us(2_000)));
        // Another stream learns apart.
        let other = (STREAM.0, 8);
        learned.learn(other, us(50));
        assert_eq!(learned.typical(other), Some(us(50)));
        assert_eq!(learned.typical(STREAM), Some(us(2_000)));
    }

    /// The window: from 1/32 of the typical length (at least 20 µs) before the expected end to
    /// 1/16 (at least 50 µs) after; never before the arrival.
    #[test]
    fn the_window_brackets_the_expected_completion() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        assert_eq!(learned.window(STREAM, arrived), None, "nothing learned yet");
        learned.learn(STREAM, us(3_200));
        assert_eq!(
            learned.window(STREAM, arrived),
            Some(Window {
                from: arrived + us(3_100),
                until: arrived + us(3_400),
            })
        );
        let short = (STREAM.0, 9);
        learned.learn(short, us(100));
        assert_eq!(
            learned.window(short, arrived),
            Some(Window {
                from: arrived + us(80),
                until: arrived + us(150),
            })
        );
        let tiny = (STREAM.0, 10);
        learned.learn(tiny, us(5));
        assert_eq!(
            learned.window(tiny, arrived),
            Some(Window {
                from: arrived,
                until: arrived + us(55),
            })
        );
    }

    /// Beyond `STREAMS` streams the list starts over, so it stays bounded; a stream already
    /// listed is updated in place.
    #[test]
    fn the_streams_remembered_are_bounded() {
        let mut learned = LearnedWaits::default();
        for stream in 0..STREAMS as u64 {
            learned.learn((STREAM.0, stream), us(10));
        }
        assert_eq!(learned.typical.len(), STREAMS);
        learned.learn((STREAM.0, 0), us(10));
        assert_eq!(
            learned.typical.len(),
            STREAMS,
            "a listed stream started it over"
        );
        learned.learn((STREAM.0, STREAMS as u64), us(10));
        assert_eq!(learned.typical.len(), 1);
    }

    /// Inside a window: spin. Before one: the pause ends at its start. After all: the pace's own
    /// pause. A spin, or nothing pending, is kept.
    #[test]
    fn a_pause_ends_at_the_next_window_and_a_window_spins() {
        let now = Instant::now();
        let window = |from: u64, until: u64| Window {
            from: now + us(from),
            until: now + us(until),
        };
        let park = Some(Wait::Park(us(250)));
        assert_eq!(adjust(park, now, []), park);
        assert_eq!(
            adjust(park, now, [window(100, 300)]),
            Some(Wait::Park(us(100)))
        );
        assert_eq!(
            adjust(park, now, [window(900, 950), window(40, 90)]),
            Some(Wait::Park(us(40)))
        );
        assert_eq!(
            adjust(park, now, [window(400, 500)]),
            park,
            "beyond the pause"
        );
        assert_eq!(
            adjust(park, now + us(100), [window(900, 950), window(100, 300)]),
            Some(Wait::Spin),
            "at a window's start"
        );
        assert_eq!(
            adjust(park, now + us(300), [window(100, 300)]),
            park,
            "a window over"
        );
        assert_eq!(
            adjust(Some(Wait::Spin), now, [window(100, 300)]),
            Some(Wait::Spin)
        );
        assert_eq!(adjust(None, now, [window(0, 300)]), None);
    }
}
