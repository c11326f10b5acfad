//! Model checks, with loom, of a launch record's ownership: the real [`LaunchState`] of
//! `launch_state.rs`, driven by threads standing in for the launcher, the driver's thread (a
//! trampoline call, or several: replays of a graph that captured the launch), a reclaim, and a
//! graph's user-object destructor.
//!
//! Every model checks the promise: the payload runs at most once, the record is pushed (released)
//! exactly once when anyone may release it, and the push happens after the run (a
//! `loom::cell::UnsafeCell` the run writes and the push reads: loom reports a push not ordered
//! after the run).
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
    runs: AtomicUsize,
    pushes: AtomicUsize,
    reclaims: AtomicUsize,
}

impl Record {
    fn new() -> Arc<Record> {
        Arc::new(Record {
            state: LaunchState::new(),
            payload: UnsafeCell::new(0),
            runs: AtomicUsize::new(0),
            pushes: AtomicUsize::new(0),
            reclaims: AtomicUsize::new(0),
        })
    }

    /// The release: reads what the run wrote.
    fn push(&self) {
        self.payload.with(|p| {
            // SAFETY: loom checks that no run writes concurrently.
            let _ = unsafe { *p };
        });
        self.pushes.fetch_add(1, Ordering::SeqCst);
    }

    /// One call of the trampoline (the stream's run, or a replay).
    fn trampoline(&self) {
        let Claim::Run(claim) = self.state.claim_run() else {
            return;
        };
        self.payload.with_mut(|p| {
            // SAFETY: loom checks that no other run or push touches it concurrently.
            unsafe { *p += 1 };
        });
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.state.run_over(claim) {
            self.push();
        }
    }

    /// A reclaim of the record's context.
    fn reclaim(&self) {
        if let Some(push) = self.state.claim_reclaim() {
            self.reclaims.fetch_add(1, Ordering::SeqCst);
            if push {
                self.push();
            }
        }
    }

    /// The graph's user object is destroyed.
    fn graph_gone(&self) {
        if self.state.let_go() {
            self.push();
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
        record.finish_launch(record.state.launched());
        driver.join().unwrap();
        assert_eq!((record.runs(), record.pushes()), (1, 1));
    });
}

#[test]
fn loom_a_reclaim_racing_a_launch_and_its_trampoline_takes_it_or_not_but_one_releases_it() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        let driver = spawn(&record, Record::trampoline);
        let reclaimer = spawn(&record, Record::reclaim);
        record.finish_launch(record.state.launched());
        driver.join().unwrap();
        reclaimer.join().unwrap();
        assert_eq!(record.pushes(), 1);
        assert_eq!(record.runs() + record.reclaims(), 1);
    });
}

#[test]
fn loom_a_refused_launch_is_never_reclaimed() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        let reclaimer = spawn(&record, Record::reclaim);
        // Refused: the launcher releases the record itself.
        record.state.untrack();
        record.push();
        reclaimer.join().unwrap();
        assert_eq!((record.reclaims(), record.pushes()), (0, 1));
    });
}

#[test]
fn loom_a_launch_a_capture_may_have_taken_waits_for_its_graph_and_its_run() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        // The stream's run (or the graph's first replay) and a second replay.
        let first = spawn(&record, Record::trampoline);
        let second = spawn(&record, Record::trampoline);
        record.state.prepare_capture();
        // The tie is made: from now on the graph may be destroyed.
        let graph = spawn(&record, Record::graph_gone);
        record.finish_launch(record.state.captured());
        first.join().unwrap();
        second.join().unwrap();
        graph.join().unwrap();
        assert!(record.runs() <= 1, "a run-once payload ran twice");
        // Both runs were tried: the payload ran, so both holds went and it was pushed once.
        assert_eq!((record.runs(), record.pushes()), (1, 1));
    });
}

#[test]
fn loom_a_captured_launch_never_run_is_released_by_a_reclaim_and_its_graph() {
    loom::model(|| {
        let record = Record::new();
        record.state.begin();
        record.state.prepare_capture();
        let graph = spawn(&record, Record::graph_gone);
        let reclaimer = spawn(&record, Record::reclaim);
        let replay = spawn(&record, Record::trampoline);
        record.finish_launch(record.state.captured());
        graph.join().unwrap();
        reclaimer.join().unwrap();
        replay.join().unwrap();
        assert_eq!(record.pushes(), 1);
        assert_eq!(record.runs() + record.reclaims(), 1);
    });
}
