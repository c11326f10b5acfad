//! Model checks, with loom, of a launch record's ownership: the real [`LaunchState`] of
//! `launch_state.rs`, driven by threads standing in for the launcher, the driver's thread (a
//! trampoline call, or several: replays of a graph that captured the launch) and a reclaim.
//!
//! Every model checks the promise: the payload runs at most once, the record is pushed (released)
//! exactly once when anyone may release it (never, when a capture may have taken it), the push happens after the run (a
//! `loom::cell::UnsafeCell` the run writes and the push reads), and after every other party's last
//! touch of the record (each party reads a second cell just before each of its steps, which the
//! push writes as the release frees the memory: loom reports a push not ordered after them).
//!
//! The models keep the driver's side of the contract: a launch is either captured (replays call
//! the trampoline) or not (the stream calls it once), never both; and a reclaim comes only once the
//! driver will not call the trampoline of a launch it did not capture any more (after its one call,
//! or with none).
//!
//! Run them with `scripts/loom loom_launch_state`.

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

use crate::launch_state::{Claim, LaunchOver, LaunchState};
use crate::sync::Ordering;

/// A record: its state, its payload's effect, and how often it was pushed and run.
struct Record {
    state: LaunchState,
    payload: UnsafeCell<usize>,
    /// Stands for the record's memory: read before every step, written by the release.
    memory: UnsafeCell<()>,
    runs: AtomicUsize,
    pushes: AtomicUsize,
    reclaims: AtomicUsize,
}

// SAFETY: the cells are loom's, which checks every access to them for races (that is the point).
unsafe impl Sync for Record {}

impl Record {
    fn new() -> Arc<Record> {
        Arc::new(Record {
            state: LaunchState::new(),
            payload: UnsafeCell::new(0),
            memory: UnsafeCell::new(()),
            runs: AtomicUsize::new(0),
            pushes: AtomicUsize::new(0),
            reclaims: AtomicUsize::new(0),
        })
    }

    /// The release: reads what the run wrote, and frees the memory.
    fn push(&self) {
        self.payload.with(|p| {
            // SAFETY: loom checks that no run writes concurrently.
            let _ = unsafe { *p };
        });
        self.memory.with_mut(|_| ());
        self.pushes.fetch_add(1, Ordering::SeqCst);
    }

    /// A party is about to touch the record.
    fn touch(&self) {
        self.memory.with(|_| ());
    }

    /// One call of the trampoline (the stream's run, or a replay).
    fn trampoline(&self) {
        self.touch();
        let Claim::Run(claim) = self.state.claim_run() else {
            return;
        };
        self.payload.with_mut(|p| {
            // SAFETY: loom checks that no other run or push touches it concurrently.
            unsafe { *p += 1 };
        });
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.touch();
        if self.state.run_over(claim) {
            self.push();
        }
    }

    /// A reclaim of the record's context.
    /// (A reclaim reads records that may be released meanwhile; the pool's lock or the pending
    /// list's keeps their memory while it does, which the pool's models check: no touch here.)
    fn reclaim(&self) {
        if self.state.claim_reclaim() {
            self.reclaims.fetch_add(1, Ordering::SeqCst);
            self.push();
        }
    }

    /// Two replays of a graph that captured the launch.
    fn replays(&self) {
        self.trampoline();
        self.trampoline();
    }

    /// The launcher's step once its launch call returned: `captured` if the stream is capturing.
    fn launched(&self, captured: bool) {
        self.touch();
        if captured {
            self.state.captured();
        } else {
            self.finish_launch(self.state.launched());
        }
    }

    fn finish_launch(&self, over: LaunchOver) {
        if over == LaunchOver::Push {
            self.push();
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn pushes(&self) -> usize {
        self.pushes.load(Ordering::SeqCst)
    }

    fn reclaims(&self) -> usize {
        self.reclaims.load(Ordering::SeqCst)
    }
}

fn spawn(record: &Arc<Record>, f: fn(&Record)) -> thread::JoinHandle<()> {
    let record = Arc::clone(record);
    thread::spawn(move || f(&record))
}

#[test]
fn loom_a_launch_and_its_trampoline_push_the_record_once_after_its_run() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        let driver = spawn(&record, Record::trampoline);
        record.launched(false);
        driver.join().unwrap();
        assert_eq!((record.runs(), record.pushes()), (1, 1));
    });
}

#[test]
fn loom_a_reclaim_after_the_driver_ran_it_racing_its_launcher_releases_it_once() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        // The driver runs it, then the context is reset and reclaimed, while the launcher finishes.
        let driver = spawn(&record, |r| {
            r.trampoline();
            r.reclaim();
        });
        record.launched(false);
        driver.join().unwrap();
        assert_eq!(
            (record.runs(), record.reclaims(), record.pushes()),
            (1, 0, 1)
        );
    });
}

#[test]
fn loom_a_reclaim_racing_a_launch_the_driver_never_runs_releases_it_at_most_once() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        // A sticky error: the driver never runs it; the reset's reclaim races the launcher.
        let reclaimer = spawn(&record, Record::reclaim);
        record.launched(false);
        reclaimer.join().unwrap();
        assert_eq!(record.runs(), 0);
        // Reclaimed once, or (the reclaim came while the launch call ran) kept: never twice.
        assert_eq!(record.pushes(), record.reclaims());
        assert!(record.pushes() <= 1);
    });
}

#[test]
fn loom_a_refused_launch_is_never_reclaimed() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        let reclaimer = spawn(&record, Record::reclaim);
        // Refused: the launcher releases the record itself.
        record.touch();
        record.state.untrack();
        record.push();
        reclaimer.join().unwrap();
        assert_eq!((record.reclaims(), record.pushes()), (0, 1));
    });
}

#[test]
fn loom_a_captured_launch_runs_once_over_replays_and_is_kept() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        // The launch was captured: the graph is replayed (from the capture's end on), while the
        // launcher finishes.
        let graph = spawn(&record, Record::replays);
        record.launched(true);
        graph.join().unwrap();
        assert_eq!((record.runs(), record.pushes()), (1, 0));
    });
}

#[test]
fn loom_a_launch_ahead_of_a_capture_runs_once_and_is_kept() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        // The launch went ahead of the capture: the stream runs it once, at any time.
        let stream_run = spawn(&record, Record::trampoline);
        record.launched(true);
        stream_run.join().unwrap();
        assert_eq!((record.runs(), record.pushes()), (1, 0));
    });
}

#[test]
fn loom_a_kept_launch_is_never_reclaimed() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        let reclaimer = spawn(&record, Record::reclaim);
        record.launched(true);
        reclaimer.join().unwrap();
        // Held (LAUNCHING) until the launcher looked again, then kept: never reclaimed, never
        // pushed.
        assert_eq!((record.reclaims(), record.pushes()), (0, 0));
    });
}
