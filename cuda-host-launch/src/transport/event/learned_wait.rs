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
//!   Beside it, `spread`: how far the samples fall from `typical` (each moves it a quarter of the
//!   way to its own distance; it starts at half the first sample). A stream is **regular** while
//!   its spread is at most `typical / 16`: about eight agreeing samples in a row make it so, and
//!   one that falls far off undoes it.
//! - **The window** of a stream's oldest pending entry, arrived at `a`: from
//!   `a + typical − early` to `a + typical + late`, `early` = max(typical / 32, 20 µs), `late` =
//!   max(typical / 16, 50 µs). Inside a window the side spins; a pause ends at the next window's
//!   start; once past a window, the usual pace goes on. So a wait costs at most `early + late` of
//!   spinning more than the usual pace, about a tenth of it, and a repeated one less (the spin
//!   ends at the completion).
//! - **Before the windows of regular streams** the side does not need the usual pace's short
//!   pauses (they grow with the wait from `interval`: about 45 rounds in a 2 ms wait, each a
//!   timed park and a query, most of its CPU time there; `BENCHMARKS.md`). While every pending
//!   stream is regular and before its window, each pause runs to the first window's start,
//!   `max_interval` at most (never shorter than the pace's own pause, so `interval` where that is
//!   longer): a completion earlier than learned is still seen within `max_interval`, and a wait
//!   costs a round per `max_interval` and its window's spin. An entry seen complete before its
//!   window, oldest first while newer ones wait (no sample), ends its stream's regularity: a busy
//!   stream whose work got shorter would otherwise stay regular with nothing to undo it.
//! - **Inside the window of a lone entry's long work** (learned at 800 µs or more, the entry the
//!   only one its queue holds) the side queries without its query gap
//!   (`PollerSettings::query_gap`, which keeps a spinning side off the driver's lock most of the
//!   time): the end is expected then, and such a window is 3/32 of the wait. Shorter work, and a
//!   queue of several entries (a busy stream, whose learned length counts its entries' time in
//!   the queue), keep the gap.
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
/// Work at least this long, a lone entry's, is spun for without the side's query gap inside its
/// window ([`spins_without_gap`]): its window is then 3/32 of the wait (the least spins, 20 µs
/// before and 50 µs after, are a thirty-second and a sixteenth of it from here).
const LONG_WAIT: Duration = Duration::from_micros(800);

/// A stream: its context and `cuStreamGetId`.
pub(super) type StreamKey = (ContextKey, u64);

/// What each stream's waits were like, learned from its completions.
#[derive(Default)]
pub(super) struct LearnedWaits {
    streams: HashMap<StreamKey, Learned, FastHash>,
}

/// What is known of one stream's waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Learned {
    /// Its usual wait.
    typical: Duration,
    /// How far its waits fall from `typical`, usually.
    spread: Duration,
}

impl Learned {
    /// Its waits agree closely enough to trust the window (see the module's docs).
    fn regular(&self) -> bool {
        self.spread <= self.typical / 16
    }
}

/// `from` moved a quarter of the way to `to`.
fn toward(from: Duration, to: Duration) -> Duration {
    if to >= from {
        from + (to - from) / 4
    } else {
        from - (from - to) / 4
    }
}

impl LearnedWaits {
    /// A stream's newest entry, arrived `waited` ago, was seen complete now.
    pub(super) fn learn(&mut self, stream: StreamKey, waited: Duration) {
        if self.streams.len() >= STREAMS && !self.streams.contains_key(&stream) {
            self.streams.clear();
        }
        self.streams
            .entry(stream)
            .and_modify(|learned| {
                learned.spread = toward(learned.spread, waited.abs_diff(learned.typical));
                learned.typical = toward(learned.typical, waited);
            })
            .or_insert(Learned {
                typical: waited,
                spread: waited / 2,
            });
    }

    /// A stream's newest entry, arrived at `arrived`, was seen complete at `now`; the look before
    /// this one at the stream was at `looked` (not before `arrived`). Learned as a sample; and if
    /// that look came before the entry's window opened, the entry may have completed before the
    /// window too (the window's first look, after a pause that ran to it, sees only that it is
    /// done): the stream is not regular any more. Without this, the pauses that run to a regular
    /// stream's window would be learned as its wait: each completion seen at the next window, and
    /// that delay the next sample (the watcher learning its own lateness).
    pub(super) fn learn_seen(
        &mut self,
        stream: StreamKey,
        arrived: Instant,
        looked: Instant,
        now: Instant,
    ) {
        let early = self
            .window(stream, arrived)
            .is_some_and(|window| looked.max(arrived) < window.from);
        self.learn(stream, now.saturating_duration_since(arrived));
        if let Some(learned) = self.streams.get_mut(&stream).filter(|_| early) {
            learned.spread = learned.spread.max(learned.typical);
        }
    }

    /// An entry of a stream, arrived at `arrived`, was seen complete at `now` with newer ones still
    /// pending (completed oldest first: no sample). Seen before its window's start, it completed
    /// earlier than learned: the stream is not regular any more (its pauses would otherwise run
    /// past such completions for as long as the stream stays busy, since a busy stream gives no
    /// new sample to undo it).
    pub(super) fn seen_early_maybe(&mut self, stream: StreamKey, arrived: Instant, now: Instant) {
        let early = self
            .window(stream, arrived)
            .is_some_and(|window| now < window.from);
        if let Some(learned) = self.streams.get_mut(&stream).filter(|_| early) {
            learned.spread = learned.spread.max(learned.typical);
        }
    }

    /// The window in which the stream's entry that arrived at `arrived` is expected to complete
    /// (`None`: the stream's work has no learned length yet).
    pub(super) fn window(&self, stream: StreamKey, arrived: Instant) -> Option<Window> {
        let learned = *self.streams.get(&stream)?;
        let typical = learned.typical;
        let expected = arrived.checked_add(typical)?;
        let from = expected
            .checked_sub((typical / 32).max(EARLY))
            .unwrap_or(arrived)
            .max(arrived);
        let until = expected.checked_add((typical / 16).max(LATE))?;
        Some(Window {
            from,
            until,
            regular: learned.regular(),
            long: typical >= LONG_WAIT,
        })
    }

    /// Into `out`, for each pending queue (its stream's key, its oldest entry's arrival, `None` if
    /// not known, and how many entries it holds), the window of that entry: `None` where nothing
    /// is learned or the arrival is not known, which [`adjust`] counts as not regular. Only a lone
    /// entry's window is long (see [`LONG_WAIT`]).
    pub(super) fn windows_of(
        &self,
        fronts: impl IntoIterator<Item = (StreamKey, Option<Instant>, usize)>,
        out: &mut Vec<Option<Window>>,
    ) {
        out.extend(fronts.into_iter().map(|(stream, arrived, waiting)| {
            let window = self.window(stream, arrived?)?;
            Some(Window {
                long: window.long && waiting == 1,
                ..window
            })
        }));
    }

    /// The learned length of a stream's work (tests).
    #[cfg(test)]
    pub(super) fn typical(&self, stream: StreamKey) -> Option<Duration> {
        self.streams.get(&stream).map(|learned| learned.typical)
    }
}

/// When a pending entry is expected to complete: the side spins from `from` to `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) from: Instant,
    pub(super) until: Instant,
    /// Its stream's waits are regular (see the module's docs).
    pub(super) regular: bool,
    /// Its stream's work is long ([`LONG_WAIT`] at least; and, from [`LearnedWaits::windows_of`],
    /// its entry waits alone in its queue): see [`spins_without_gap`].
    pub(super) long: bool,
}

/// Whether a spinning side queries without its query gap (`PollerSettings::query_gap`) for the
/// round after `now`: while `now` is inside a long window (a lone entry's long work). The gap
/// keeps a spinning side from holding the driver's lock, which every enqueue takes, most of the
/// time; inside such a window the completion is expected now, and the window is 3/32 of the
/// wait, so the side's share of the lock stays small while the wait's end is seen a gap sooner
/// (`BENCHMARKS.md`).
pub(super) fn spins_without_gap(
    windows: impl IntoIterator<Item = Option<Window>>,
    now: Instant,
) -> bool {
    windows
        .into_iter()
        .flatten()
        .any(|window| window.long && window.from <= now && now < window.until)
}

/// The wait after a round at `now`, given the window of each stream pending (`None`: its work has
/// no learned length): a spin inside a window, a pause cut short at the start of the next. While
/// every stream pending is regular and before its window, the pause runs to the first window's
/// start, `longest` at most (and never shorter than the pace's). A spin, or nothing pending, is
/// left as it is.
pub(super) fn adjust(
    wait: Option<Wait>,
    now: Instant,
    windows: impl IntoIterator<Item = Option<Window>>,
    longest: Duration,
) -> Option<Wait> {
    let Some(Wait::Park(mut pause)) = wait else {
        return wait;
    };
    let mut to_first_window: Option<Duration> = None;
    let mut all_regular_ahead = true;
    for window in windows {
        let Some(window) = window else {
            all_regular_ahead = false;
            continue;
        };
        if window.from <= now && now < window.until {
            return Some(Wait::Spin);
        }
        if window.from > now {
            let to_start = window.from - now;
            pause = pause.min(to_start);
            to_first_window = Some(to_first_window.map_or(to_start, |first| first.min(to_start)));
            all_regular_ahead &= window.regular;
        } else {
            // Past its window: later than learned, the usual pace.
            all_regular_ahead = false;
        }
    }
    if let Some(first) = to_first_window.filter(|_| all_regular_ahead) {
        pause = pause.max(first.min(longest));
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
                regular: false,
                long: true,
            })
        );
        let short = (STREAM.0, 9);
        learned.learn(short, us(100));
        assert_eq!(
            learned.window(short, arrived),
            Some(Window {
                from: arrived + us(80),
                until: arrived + us(150),
                regular: false,
                long: false,
            })
        );
        let tiny = (STREAM.0, 10);
        learned.learn(tiny, us(5));
        assert_eq!(
            learned.window(tiny, arrived),
            Some(Window {
                from: arrived,
                until: arrived + us(55),
                regular: false,
                long: false,
            })
        );
    }

    /// Work of 800 µs or more is long; inside a long window (its start included, its end not) a
    /// spinning side queries without its gap, inside a short one or outside every window with it.
    /// (Mutation testing: each comparison.)
    #[test]
    fn a_side_spins_without_its_gap_only_inside_the_window_of_long_work() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        let (long, short) = ((STREAM.0, 11), (STREAM.0, 12));
        learned.learn(long, us(800));
        learned.learn(short, us(799));
        let long = learned.window(long, arrived).unwrap();
        let short = learned.window(short, arrived).unwrap();
        assert!(long.long && !short.long);
        assert_eq!(
            (long.from, long.until),
            (arrived + us(775), arrived + us(850))
        );
        for (at, expected) in [(774, false), (775, true), (849, true), (850, false)] {
            assert_eq!(
                spins_without_gap([Some(long)], arrived + us(at)),
                expected,
                "at {at} µs"
            );
        }
        assert!(!spins_without_gap([Some(short)], arrived + us(800)));
        assert!(!spins_without_gap([None], arrived + us(800)));
        assert!(spins_without_gap(
            [Some(short), None, Some(long)],
            arrived + us(800)
        ));
    }

    /// Only a lone entry's window is long: a queue of several entries (whose learned length
    /// counts their time in the queue) keeps the gap. (Mutation testing: the count's comparison.)
    #[test]
    fn a_queue_of_several_entries_keeps_the_gap() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        learned.learn(STREAM, us(2_000));
        let mut out = Vec::new();
        learned.windows_of(
            [(STREAM, Some(arrived), 1), (STREAM, Some(arrived), 2)],
            &mut out,
        );
        let [Some(lone), Some(busy)] = out[..] else {
            panic!("two windows: {out:?}");
        };
        assert!(lone.long && !busy.long);
        assert_eq!((lone.from, lone.until), (busy.from, busy.until));
    }

    /// Beyond `STREAMS` streams the list starts over, so it stays bounded; a stream already
    /// listed is updated in place.
    #[test]
    fn the_streams_remembered_are_bounded() {
        let mut learned = LearnedWaits::default();
        for stream in 0..STREAMS as u64 {
            learned.learn((STREAM.0, stream), us(10));
        }
        assert_eq!(learned.streams.len(), STREAMS);
        learned.learn((STREAM.0, 0), us(10));
        assert_eq!(
            learned.streams.len(),
            STREAMS,
            "a listed stream started it over"
        );
        learned.learn((STREAM.0, STREAMS as u64), us(10));
        assert_eq!(learned.streams.len(), 1);
    }

    /// A stream is regular once its samples agree for a while (spread ≤ typical / 16), and one
    /// sample far off undoes it. (Mutation testing: `spread`'s moves and the bound.)
    #[test]
    fn agreeing_samples_make_a_stream_regular_and_one_far_off_undoes_it() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        let regular = |learned: &LearnedWaits| learned.window(STREAM, arrived).unwrap().regular;
        learned.learn(STREAM, us(1_600));
        assert_eq!(
            learned.streams[&STREAM].spread,
            us(800),
            "half the first sample"
        );
        learned.learn(STREAM, us(2_000));
        // Off by 400: the spread moves a quarter of the way from 800 to 400; typical to 1,700.
        assert_eq!(
            learned.streams[&STREAM],
            Learned {
                typical: us(1_700),
                spread: us(700),
            }
        );
        let mut samples = 2;
        while !regular(&learned) {
            learned.learn(STREAM, us(1_700));
            samples += 1;
            assert!(samples < 20, "agreeing samples never made it regular");
        }
        // 700 µs × (3/4)^n ≤ 1,700 / 16 µs: n = 7 agreeing samples.
        assert_eq!(samples, 2 + 7);
        assert!(learned.streams[&STREAM].spread <= us(1_700) / 16);
        // One sample half the usual length: not regular any more.
        learned.learn(STREAM, us(850));
        assert!(!regular(&learned));
        // The spread's bound, exactly: typical / 16.
        let at_bound = Learned {
            typical: us(1_600),
            spread: us(100),
        };
        assert!(at_bound.regular());
        assert!(
            !Learned {
                spread: us(101),
                ..at_bound
            }
            .regular()
        );
    }

    /// One window per pending stream, in order: `None` for a stream with nothing learned or an
    /// oldest entry whose arrival is not known, so that such a stream keeps the pace's pauses.
    #[test]
    fn every_pending_stream_has_a_place_in_the_windows() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        learned.learn(STREAM, us(3_200));
        let unknown = (STREAM.0, 99);
        let mut out = vec![None];
        learned.windows_of(
            [
                (STREAM, Some(arrived), 1),
                (unknown, Some(arrived), 1),
                (STREAM, None, 1),
            ],
            &mut out,
        );
        assert_eq!(
            out,
            [None, learned.window(STREAM, arrived), None, None],
            "appended, one per stream"
        );
        assert!(out[1].is_some());
    }

    /// A completion seen by a look that followed one inside its window is a sample like any other;
    /// one seen at the window's first look (the look before it came before the window) may have
    /// come before the window, and makes the stream not regular.
    #[test]
    fn a_completion_seen_at_the_windows_first_look_undoes_regular() {
        let arrived = Instant::now();
        let regular_stream = || {
            let mut learned = LearnedWaits::default();
            learned.streams.insert(
                STREAM,
                Learned {
                    typical: us(1_600),
                    spread: us(10),
                },
            );
            learned
        };
        let regular = |learned: &LearnedWaits| learned.window(STREAM, arrived).unwrap().regular;
        // The window opens at 1,600 − 50 µs.
        let opens = arrived + us(1_550);
        let mut learned = regular_stream();
        learned.learn_seen(STREAM, arrived, opens, arrived + us(1_600));
        assert!(regular(&learned), "the look before was inside the window");
        assert_eq!(learned.typical(STREAM), Some(us(1_600)));
        let mut learned = regular_stream();
        learned.learn_seen(STREAM, arrived, opens - us(1), arrived + us(1_600));
        assert!(!regular(&learned), "the look before came before the window");
        assert_eq!(learned.typical(STREAM), Some(us(1_600)), "still a sample");
        // A look before the entry arrived counts from its arrival: a short stream's window opens
        // at the arrival, and a completion seen at its first look is no sign of anything.
        let mut learned = LearnedWaits::default();
        let short = (STREAM.0, 9);
        learned.streams.insert(
            short,
            Learned {
                typical: us(10),
                spread: us(0),
            },
        );
        learned.learn_seen(short, arrived, arrived - us(100), arrived + us(10));
        assert!(learned.window(short, arrived).unwrap().regular);
        // Nothing learned yet: the first sample, nothing more.
        let mut learned = LearnedWaits::default();
        learned.learn_seen(STREAM, arrived, arrived, arrived + us(1_000));
        assert_eq!(learned.typical(STREAM), Some(us(1_000)));
    }

    /// An entry seen complete before its window (oldest first, no sample) makes its stream not
    /// regular; one seen inside or after it, or a stream with nothing learned, changes nothing.
    #[test]
    fn an_entry_seen_before_its_window_undoes_regular() {
        let mut learned = LearnedWaits::default();
        let arrived = Instant::now();
        learned.seen_early_maybe(STREAM, arrived, arrived);
        assert_eq!(
            learned.typical(STREAM),
            None,
            "nothing learned: nothing made up"
        );
        learned.streams.insert(
            STREAM,
            Learned {
                typical: us(1_600),
                spread: us(10),
            },
        );
        let regular = |learned: &LearnedWaits| learned.window(STREAM, arrived).unwrap().regular;
        assert!(regular(&learned));
        // The window opens at 1,600 − 50 µs.
        learned.seen_early_maybe(STREAM, arrived, arrived + us(1_550));
        assert!(regular(&learned), "seen at the window's start");
        learned.seen_early_maybe(STREAM, arrived, arrived + us(2_000));
        assert!(regular(&learned), "seen after the window");
        learned.seen_early_maybe(STREAM, arrived, arrived + us(1_549));
        assert!(!regular(&learned), "seen before the window");
        assert_eq!(learned.streams[&STREAM].spread, us(1_600));
        assert_eq!(
            learned.typical(STREAM),
            Some(us(1_600)),
            "the typical wait stays"
        );
    }

    /// Inside a window: spin. Before one: the pause ends at its start. After all: the pace's own
    /// pause. A spin, or nothing pending, is kept. Windows of streams not regular, or a stream
    /// with no window, leave the pace's pauses as they are.
    #[test]
    fn a_pause_ends_at_the_next_window_and_a_window_spins() {
        let now = Instant::now();
        let window = |from: u64, until: u64| {
            Some(Window {
                from: now + us(from),
                until: now + us(until),
                regular: false,
                long: false,
            })
        };
        let longest = us(250);
        let park = Some(Wait::Park(us(250)));
        assert_eq!(adjust(park, now, [], longest), park);
        assert_eq!(
            adjust(park, now, [window(100, 300)], longest),
            Some(Wait::Park(us(100)))
        );
        assert_eq!(
            adjust(park, now, [window(900, 950), window(40, 90)], longest),
            Some(Wait::Park(us(40)))
        );
        assert_eq!(
            adjust(park, now, [window(400, 500)], longest),
            park,
            "beyond the pause"
        );
        assert_eq!(
            adjust(
                park,
                now + us(100),
                [window(900, 950), window(100, 300)],
                longest
            ),
            Some(Wait::Spin),
            "at a window's start"
        );
        assert_eq!(
            adjust(park, now + us(300), [window(100, 300)], longest),
            park,
            "a window over"
        );
        assert_eq!(
            adjust(Some(Wait::Spin), now, [window(100, 300)], longest),
            Some(Wait::Spin)
        );
        assert_eq!(adjust(None, now, [window(0, 300)], longest), None);
        let short = Some(Wait::Park(us(20)));
        assert_eq!(
            adjust(short, now, [window(400, 500)], longest),
            short,
            "not regular: the pace's pause"
        );
    }

    /// While every pending stream is regular and before its window, a pause runs to the first
    /// window's start, `longest` at most, never shorter than the pace's; a stream with no window,
    /// one not regular, or one past its window keeps the pace's pause.
    #[test]
    fn before_the_windows_of_regular_streams_a_pause_runs_to_the_first() {
        let now = Instant::now();
        let regular = |from: u64, until: u64| {
            Some(Window {
                from: now + us(from),
                until: now + us(until),
                regular: true,
                long: false,
            })
        };
        let irregular = |from: u64, until: u64| {
            regular(from, until).map(|window| Window {
                regular: false,
                long: false,
                ..window
            })
        };
        let longest = us(250);
        let short = Some(Wait::Park(us(20)));
        assert_eq!(
            adjust(short, now, [regular(100, 300)], longest),
            Some(Wait::Park(us(100))),
            "to the window's start"
        );
        assert_eq!(
            adjust(
                short,
                now,
                [regular(1_900, 2_100), regular(700, 900)],
                longest
            ),
            Some(Wait::Park(us(250))),
            "max_interval at most"
        );
        assert_eq!(
            adjust(
                short,
                now,
                [regular(1_900, 2_100), regular(180, 900)],
                longest
            ),
            Some(Wait::Park(us(180))),
            "the first window's start"
        );
        assert_eq!(
            adjust(short, now, [regular(1_900, 2_100), None], longest),
            short,
            "a stream with no window"
        );
        assert_eq!(
            adjust(
                short,
                now,
                [regular(1_900, 2_100), irregular(700, 900)],
                longest
            ),
            short,
            "a stream not regular"
        );
        assert_eq!(
            adjust(
                short,
                now + us(1_000),
                [regular(1_900, 2_100), regular(100, 300)],
                longest
            ),
            short,
            "a stream past its window"
        );
        assert_eq!(
            adjust(
                short,
                now + us(200),
                [regular(1_900, 2_100), regular(100, 300)],
                longest
            ),
            Some(Wait::Spin),
            "a stream in its window"
        );
        let long = Some(Wait::Park(us(400)));
        assert_eq!(
            adjust(long, now, [regular(1_900, 2_100)], longest),
            long,
            "never shorter than the pace's pause"
        );
        assert_eq!(
            adjust(long, now, [regular(300, 2_100)], longest),
            Some(Wait::Park(us(300))),
            "cut at a window's start, as ever"
        );
    }
}
