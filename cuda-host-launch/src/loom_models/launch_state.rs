//! Model checks, with loom, of a launch's ownership: the real [`LaunchState`] of
//! `launch_state.rs`, driven by threads standing in for the launcher, the driver's thread (a
//! trampoline call, or several: replays of a graph that captured the launch, which may come after
//! the launch was released) and a reclaim.
//!
//! Every model checks the promise: the payload runs at most once, the record is pushed (released)
//! exactly once, the push happens after the run (a `loom::cell::UnsafeCell` the run writes and the
//! push reads), and no call touches the record after its release (the release writes a second
//! cell, which a run reads: loom reports a run not ordered before the release). A call that comes
//! after the release finds the ticket retired (the next generation) and touches nothing.
//!
//! The models keep the driver's side of the contract: a reclaim comes only once the driver will
//! not call the trampoline of a launch it did not capture any more (after its one call, or with
//! none).
//!
//! Run them with `scripts/loom loom_launch_state`.

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

use crate::record::launch_state::{Claim, LaunchOver, LaunchState};
use crate::support::sync::Ordering;

/// The generation of the modelled launch.
const GENERATION: u64 = 7;

/// A launch: its ticket's state, its record's payload and memory, and how often it was run,
/// pushed and reclaimed.
struct Launch {
    state: LaunchState,
    payload: UnsafeCell<usize>,
    /// Stands for the record's memory: read by a run, written by the release.
    memory: UnsafeCell<()>,
    runs: AtomicUsize,
    pushes: AtomicUsize,
    reclaims: AtomicUsize,
}

// SAFETY: the cells are loom's, which checks every access to them for races (that is the point).
unsafe impl Sync for Launch {}

impl Launch {
    /// A launch that began (LAUNCHING).
    fn new() -> Arc<Launch> {
        let launch = Arc::new(Launch {
            state: LaunchState::new(),
            payload: UnsafeCell::new(0),
            memory: UnsafeCell::new(()),
            runs: AtomicUsize::new(0),
            pushes: AtomicUsize::new(0),
            reclaims: AtomicUsize::new(0),
        });
        launch.state.begin(GENERATION);
        launch
    }

    /// The release (the reaper's, after a push): reads what the run wrote, frees the memory and
    /// retires the ticket.
    fn push(&self) {
        self.payload.with(|p| {
            // SAFETY: loom checks that no run writes concurrently.
            let _ = unsafe { *p };
        });
        self.memory.with_mut(|_| ());
        self.state.retire(GENERATION);
        self.pushes.fetch_add(1, Ordering::SeqCst);
    }

    /// One call of the trampoline (the stream's run, or a replay).
    fn trampoline(&self) {
        let Claim::Run(claim) = self.state.claim_run(GENERATION) else {
            return;
        };
        self.memory.with(|_| ());
        self.payload.with_mut(|p| {
            // SAFETY: loom checks that no other run or push touches it concurrently.
            unsafe { *p += 1 };
        });
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.state.run_over(GENERATION, claim) {
            self.push();
        }
    }

    /// Several calls: replays of a graph that captured the launch.
    fn replays(&self) {
        self.trampoline();
        self.trampoline();
    }

    /// A reclaim of the launch's context.
    fn reclaim(&self) {
        if let Some(generation) = self.state.pending_generation()
            && self.state.claim_reclaim(generation)
        {
            self.reclaims.fetch_add(1, Ordering::SeqCst);
            self.push();
        }
    }

    /// The launcher's step once its launch call returned successfully.
    fn launched(&self) {
        if self.state.launched(GENERATION) == LaunchOver::Push {
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

fn spawn(launch: &Arc<Launch>, f: fn(&Launch)) -> thread::JoinHandle<()> {
    let launch = Arc::clone(launch);
    thread::spawn(move || f(&launch))
}

#[test]
fn loom_a_launch_and_its_trampoline_push_the_record_once_after_its_run() {
    loom::model(|| {
        let launch = Launch::new();
        let driver = spawn(&launch, Launch::trampoline);
        launch.launched();
        driver.join().unwrap();
        assert_eq!((launch.runs(), launch.pushes()), (1, 1));
    });
}

#[test]
fn loom_a_reclaim_after_the_driver_ran_it_racing_its_launcher_releases_it_once() {
    loom::model(|| {
        let launch = Launch::new();
        // The driver runs it, then the context is reset and reclaimed, while the launcher finishes.
        let driver = spawn(&launch, |l| {
            l.trampoline();
            l.reclaim();
        });
        launch.launched();
        driver.join().unwrap();
        assert_eq!(
            (launch.runs(), launch.reclaims(), launch.pushes()),
            (1, 0, 1)
        );
    });
}

#[test]
fn loom_a_reclaim_racing_a_launch_the_driver_never_runs_releases_it_at_most_once() {
    loom::model(|| {
        let launch = Launch::new();
        // A sticky error: the driver never runs it; the reset's reclaim races the launcher.
        let reclaimer = spawn(&launch, Launch::reclaim);
        launch.launched();
        reclaimer.join().unwrap();
        assert_eq!(launch.runs(), 0);
        // Reclaimed once, or (the reclaim came while the launch call ran) not: never twice.
        assert_eq!(launch.pushes(), launch.reclaims());
        assert!(launch.pushes() <= 1);
    });
}

#[test]
fn loom_a_refused_launch_is_never_reclaimed() {
    loom::model(|| {
        let launch = Launch::new();
        let reclaimer = spawn(&launch, Launch::reclaim);
        // Refused: the launcher releases the record itself.
        launch.push();
        reclaimer.join().unwrap();
        assert_eq!((launch.reclaims(), launch.pushes()), (0, 1));
    });
}

#[test]
fn loom_a_captured_launch_runs_once_and_later_replays_touch_nothing() {
    loom::model(|| {
        let launch = Launch::new();
        // The launch was captured: the graph is replayed (from the capture's end on, maybe before
        // the launcher is done), and the record is released after the first replay's run.
        let graph = spawn(&launch, Launch::replays);
        launch.launched();
        graph.join().unwrap();
        assert_eq!((launch.runs(), launch.pushes()), (1, 1));
    });
}

#[test]
fn loom_replays_racing_each_other_and_a_reclaim_run_it_at_most_once() {
    loom::model(|| {
        let launch = Launch::new();
        launch.launched();
        // Two executable graphs replayed on two streams, and the context's reclaim.
        let first = spawn(&launch, Launch::trampoline);
        let second = spawn(&launch, Launch::trampoline);
        let reclaimer = spawn(&launch, Launch::reclaim);
        first.join().unwrap();
        second.join().unwrap();
        reclaimer.join().unwrap();
        assert_eq!(launch.pushes(), 1);
        assert_eq!(launch.runs() + launch.reclaims(), 1);
    });
}

#[test]
fn loom_two_reclaims_of_a_launch_the_driver_never_runs_take_it_once() {
    loom::model(|| {
        let launch = Launch::new();
        launch.launched();
        // A sticky error: the driver never runs it; a reset's reclaim and a `reclaim_pending`.
        let first = spawn(&launch, Launch::reclaim);
        let second = spawn(&launch, Launch::reclaim);
        first.join().unwrap();
        second.join().unwrap();
        assert_eq!(
            (launch.runs(), launch.reclaims(), launch.pushes()),
            (0, 1, 1)
        );
    });
}
