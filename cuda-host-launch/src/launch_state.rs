//! Who owns a run-once launch record, from its launch until its release: the launching thread, the
//! driver's thread (the trampoline), a reclaim after a context loss, or a graph that may have
//! captured the launch. Each step is one atomic transition that exactly one party can win, so a
//! record is run at most once and released exactly once, and never while anyone may still use it.
//!
//! ```text
//!                       launch refused: the launcher releases it
//!                      /
//!   UNTRACKED --begin--> LAUNCHING --accepted--> PENDING --trampoline claims--> RAN --> pushed
//!                          |   \                    \--reclaim claims--> RECLAIMED --> pushed
//!                          |    \--trampoline claims first--> EARLY_RUNNING --run over--> EARLY_RAN
//!                          |                                  (the launcher, once it is done, or the
//!                          |                                   trampoline, if the launcher is done,
//!                          |                                   pushes it)
//!                          \--a capture may have taken it: kept for ever--> CAPTURED
//!   CAPTURED --trampoline claims--> CAPTURED_RAN      (the payload never runs again; never pushed)
//! ```
//!
//! **Why the launcher holds the record across the launch** (`LAUNCHING`): a reclaim only takes
//! `PENDING` records, so it can never release a record whose launch call has not returned: neither
//! one the driver is about to refuse (the launcher releases it) nor one the driver is about to
//! accept (the driver's thread will run it).
//!
//! **Why a launch can end up captured.** The launch asks whether the stream is capturing, and then
//! launches: two driver calls. Another thread may begin a capture on the stream in between, and the
//! host function becomes a node of that graph, run on every replay, long after a run-once record
//! would have been released. So after a successful launch the launcher asks again; if the stream is
//! capturing now, the node may be in that graph (or the launch may have gone ahead of the capture:
//! it cannot tell), and nothing can say when that graph, or a graph instantiated from it, calls the
//! record for the last time. (Tying the record to the graph with a user object would need a call on
//! a graph that the capturing thread owns, and graph objects are not thread-safe.) So the record is
//! kept for ever (`CAPTURED`): its payload runs at most once, on the first call, whether that comes
//! from the stream or a replay; later calls find it claimed and return; its owners are never
//! dropped. A capture that both begins and ends between the two questions is not seen (see
//! `RELIABILITY.md`).

use crate::sync::{AtomicU8, Ordering};

const UNTRACKED: u8 = 0;
const LAUNCHING: u8 = 1;
const PENDING: u8 = 2;
const RAN: u8 = 3;
const RECLAIMED: u8 = 4;
const EARLY_RUNNING: u8 = 5;
const EARLY_RAN: u8 = 6;
const CAPTURED: u8 = 7;
const CAPTURED_RAN: u8 = 8;

/// The ownership state of one record (a part of its header).
pub(crate) struct LaunchState {
    state: AtomicU8,
}

/// What the trampoline may do with a record the driver called it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Claim {
    /// Run the payload; then call [`LaunchState::run_over`] with this claim.
    Run(RunClaim),
    /// Do not touch the record: it ran already (a graph replay) or was reclaimed.
    Skip,
}

/// Which claim the trampoline won, for [`LaunchState::run_over`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunClaim {
    /// The usual case: `PENDING → RAN`; push the record after the run.
    Pending,
    /// The launcher still holds the record.
    Early,
    /// A record kept for ever: never pushed.
    Captured,
}

/// What a launcher must do once its launch call returned successfully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum LaunchOver {
    /// Nothing: the trampoline or a reclaim will release it.
    Done,
    /// The host function has run meanwhile: push the record to the cleanup queue.
    Push,
}

impl LaunchState {
    /// The state of a new record: not tracked.
    pub(crate) fn new() -> LaunchState {
        LaunchState {
            state: AtomicU8::new(UNTRACKED),
        }
    }

    /// The launcher takes the record into its launch. Release: what the launcher wrote into the
    /// record before (its context) is seen by whoever later sees a reclaimable state.
    pub(crate) fn begin(&self) {
        self.state.store(LAUNCHING, Ordering::Release);
    }

    /// The launch call returned success and the stream is not capturing: hand the record to the
    /// driver's thread (or to a reclaim).
    pub(crate) fn launched(&self) -> LaunchOver {
        match self
            .state
            .compare_exchange(LAUNCHING, PENDING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => LaunchOver::Done,
            Err(_) => self.take_over_early_run(RAN),
        }
    }

    /// The launch call returned success but the stream is capturing now: the node may be in the
    /// capture's graph, so the record is kept for ever (the caller keeps it reachable). The payload
    /// still runs at most once.
    pub(crate) fn captured(&self) {
        if self
            .state
            .compare_exchange(LAUNCHING, CAPTURED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // The trampoline claimed it first: whether its run is over or not, nobody pushes it.
            let _ = self.take_over_early_run(CAPTURED_RAN);
        }
    }

    /// The trampoline claimed the record while the launcher still held it. Moves it to `next`
    /// (`RAN` or `CAPTURED_RAN`): if the trampoline is still running, it will see `next` when its
    /// run is over and act on it (`Done`); if its run is over, the launcher must act (`Push`).
    fn take_over_early_run(&self, next: u8) -> LaunchOver {
        match self
            .state
            .compare_exchange(EARLY_RUNNING, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => LaunchOver::Done,
            // EARLY_RAN: the run is over. Only the launcher moves a record out of it.
            Err(_) => {
                self.state.store(next, Ordering::Release);
                LaunchOver::Push
            }
        }
    }

    /// The trampoline's claim, on the driver's thread: one compare-and-swap in the usual case.
    #[inline]
    pub(crate) fn claim_run(&self) -> Claim {
        let mut current = PENDING;
        loop {
            let (next, claim) = match current {
                PENDING => (RAN, RunClaim::Pending),
                LAUNCHING => (EARLY_RUNNING, RunClaim::Early),
                CAPTURED => (CAPTURED_RAN, RunClaim::Captured),
                _ => return Claim::Skip,
            };
            match self
                .state
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Claim::Run(claim),
                Err(actual) => current = actual,
            }
        }
    }

    /// The trampoline's run is over: returns whether the trampoline must push the record.
    #[inline]
    pub(crate) fn run_over(&self, claim: RunClaim) -> bool {
        match claim {
            RunClaim::Pending => true,
            RunClaim::Captured => false,
            RunClaim::Early => match self.state.compare_exchange(
                EARLY_RUNNING,
                EARLY_RAN,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // The launcher still holds it, and will push it.
                Ok(_) => false,
                // The launcher is done and left the push to this run.
                Err(RAN) => true,
                // The launcher keeps it for ever (a capture may have taken it).
                Err(_) => false,
            },
        }
    }

    /// A reclaim's claim (its context is gone, so its host function will never run from the
    /// stream): whether the reclaim took it, and must push it. A record kept for ever is not taken:
    /// a graph made from another thread's capture may still call it, in any context.
    pub(crate) fn claim_reclaim(&self) -> bool {
        self.state
            .compare_exchange(PENDING, RECLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the record waits for its host function: launching or launched, not run (a record
    /// kept for ever is not counted). Acquire: a launcher's writes before its `begin` are seen
    /// after a `true`.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), LAUNCHING | PENDING)
    }

    /// Whether a reclaim could take the record now (Acquire, as [`LaunchState::is_pending`]).
    pub(crate) fn is_reclaimable(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING
    }

    /// Whether a boxed record is still in its pending list: from its launch until a reclaim takes
    /// it out, or its releaser does ([`LaunchState::untrack`]). Read by the record's owner.
    pub(crate) fn is_listed(&self) -> bool {
        !matches!(self.state.load(Ordering::Acquire), UNTRACKED | RECLAIMED)
    }

    /// The record's owner is about to release it: it is not tracked any more. (No other party can
    /// change the state of a record its owner releases; a reclaim's walk may still read it.)
    pub(crate) fn untrack(&self) {
        self.state.store(UNTRACKED, Ordering::Release);
    }
}
