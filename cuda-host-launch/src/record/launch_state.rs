//! Who owns a run-once launch, from its launch until its release: the launching thread, the
//! driver's thread (the trampoline), or a reclaim after a context loss. Each step is one atomic
//! transition of a word that exactly one party can win, so a record is run at most once and
//! released exactly once, and never while anyone may still use it.
//!
//! The word belongs to the launch's ticket (see [`tickets`](super::tickets)), not to the record:
//! it holds a generation beside the state, and the driver is handed the generation with the ticket,
//! so a call that comes after the launch was released (a replay of a graph that captured it) finds
//! another generation and does nothing.
//!
//! ```text
//!                       launch refused: the launcher releases it
//!                      /
//!   FREE --begin--> LAUNCHING --accepted--> PENDING --trampoline claims--> RAN --> pushed
//!                       \                      \--reclaim claims--> RECLAIMED --> pushed
//!                        \--trampoline claims first--> EARLY_RUNNING --run over--> EARLY_RAN
//!                           (the launcher, once it is done, or the trampoline, if the launcher is
//!                            done, pushes it)
//!   whoever releases the record: --retire--> FREE, next generation
//! ```
//!
//! **Why the launcher holds the launch across the launch call** (`LAUNCHING`): a reclaim only takes
//! `PENDING` launches, so it can never release a record whose launch call has not returned: neither
//! one the driver is about to refuse (the launcher releases it) nor one the driver is about to
//! accept (the driver's thread will run it).
//!
//! **Why a call may come after the release.** The launch asks whether the stream is capturing and
//! then launches: two driver calls. Another thread may begin a capture on the stream in between
//! (and even end it before the launch returns), and the host function becomes a node of that graph,
//! called on every replay of every executable graph made from it. The first of those calls claims
//! the launch and runs it; the record is then released, its ticket retired; every later call finds
//! another generation and returns without touching anything but the ticket, which is never freed.

use crate::support::sync::{AtomicU64, Ordering};

const STATE_BITS: u32 = 8;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// The generation's width: a ticket can be reused this many times before a very late stale call
/// could take one of its generations for its own (see `tickets.rs`).
pub(crate) const GENERATION_BITS: u32 = 40;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

const FREE: u64 = 0;
const LAUNCHING: u64 = 1;
const PENDING: u64 = 2;
const RAN: u64 = 3;
const RECLAIMED: u64 = 4;
const EARLY_RUNNING: u64 = 5;
const EARLY_RAN: u64 = 6;

/// The word of a generation in a state.
const fn word(generation: u64, state: u64) -> u64 {
    ((generation & GENERATION_MASK) << STATE_BITS) | state
}

/// The ownership state of one launch (a part of its ticket).
pub(crate) struct LaunchState {
    word: AtomicU64,
}

/// What the trampoline may do with the launch the driver called it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Claim {
    /// Run the payload; then call [`LaunchState::run_over`] with this claim.
    Run(RunClaim),
    /// Do not touch the record: the launch ran already, was reclaimed, or is over (a call of
    /// another generation: a replay of a graph that captured it).
    Skip,
}

/// Which claim the trampoline won, for [`LaunchState::run_over`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunClaim {
    /// The usual case: `PENDING → RAN`; push the record after the run.
    Pending,
    /// The launcher still holds the launch.
    Early,
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
    /// A free state, generation 0.
    pub(crate) fn new() -> LaunchState {
        LaunchState {
            word: AtomicU64::new(word(0, FREE)),
        }
    }

    /// The generation the next launch of a free ticket gets (read by the ticket's new owner).
    pub(crate) fn next_generation(&self) -> u64 {
        self.word.load(Ordering::Acquire) >> STATE_BITS
    }

    /// The launcher takes the ticket into its launch. Release: what the launcher wrote into the
    /// ticket before (its record and context) is seen by whoever later sees this generation.
    pub(crate) fn begin(&self, generation: u64) {
        self.word
            .store(word(generation, LAUNCHING), Ordering::Release);
    }

    /// The launch call returned success: hand the launch to the driver's thread (or a reclaim).
    pub(crate) fn launched(&self, generation: u64) -> LaunchOver {
        if self
            .word
            .compare_exchange(
                word(generation, LAUNCHING),
                word(generation, PENDING),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return LaunchOver::Done;
        }
        // The trampoline claimed it while this thread held it. If it is still running, it will
        // push the record when its run is over; if its run is over, this thread must.
        match self.word.compare_exchange(
            word(generation, EARLY_RUNNING),
            word(generation, RAN),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => LaunchOver::Done,
            // EARLY_RAN: only the launcher moves a launch out of it.
            Err(_) => {
                self.word.store(word(generation, RAN), Ordering::Release);
                LaunchOver::Push
            }
        }
    }

    /// The trampoline's claim, on the driver's thread: one compare-and-swap in the usual case. A
    /// call of another generation (the launch is over) or of a launch already claimed is skipped.
    #[inline]
    pub(crate) fn claim_run(&self, generation: u64) -> Claim {
        let (pending, launching) = (word(generation, PENDING), word(generation, LAUNCHING));
        let mut current = pending;
        loop {
            let (next, claim) = if current == pending {
                (word(generation, RAN), RunClaim::Pending)
            } else if current == launching {
                (word(generation, EARLY_RUNNING), RunClaim::Early)
            } else {
                return Claim::Skip;
            };
            match self
                .word
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Claim::Run(claim),
                Err(actual) => current = actual,
            }
        }
    }

    /// The trampoline's run is over: returns whether the trampoline must push the record.
    #[inline]
    pub(crate) fn run_over(&self, generation: u64, claim: RunClaim) -> bool {
        match claim {
            RunClaim::Pending => true,
            // Still held: the launcher will push it. Else the launcher left the push to this run.
            RunClaim::Early => self
                .word
                .compare_exchange(
                    word(generation, EARLY_RUNNING),
                    word(generation, EARLY_RAN),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err(),
        }
    }

    /// A reclaim's look: the generation of a launch that waits for its host function (launched,
    /// not yet claimed), if this one does. Acquire: the ticket's record and context, written
    /// before the launch began, are seen after a `Some`.
    pub(crate) fn pending_generation(&self) -> Option<u64> {
        let current = self.word.load(Ordering::Acquire);
        (current & STATE_MASK == PENDING).then_some(current >> STATE_BITS)
    }

    /// Whether a launch is in progress or waits for its host function (Acquire, as
    /// [`LaunchState::pending_generation`]).
    pub(crate) fn is_pending(&self) -> bool {
        matches!(
            self.word.load(Ordering::Acquire) & STATE_MASK,
            LAUNCHING | PENDING
        )
    }

    /// A reclaim's claim of the launch of `generation` (its context is gone, so its host function
    /// will never run from the stream): whether the reclaim took it, and must push it.
    pub(crate) fn claim_reclaim(&self, generation: u64) -> bool {
        self.word
            .compare_exchange(
                word(generation, PENDING),
                word(generation, RECLAIMED),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whoever releases the record of the launch of `generation` (its owner: no other party
    /// changes the state any more) frees the ticket for another launch: a later call of this
    /// generation finds the next one and does nothing.
    pub(crate) fn retire(&self, generation: u64) {
        self.word
            .store(word(generation.wrapping_add(1), FREE), Ordering::Release);
    }
}

// Outside the loom models: loom's atomics work only inside one (`loom_models::launch_state`
// checks the same transitions under every interleaving).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// One launch of `generation` from begin to retire, as the usual path runs it.
    fn one_launch(state: &LaunchState, generation: u64) {
        state.begin(generation);
        assert_eq!(state.launched(generation), LaunchOver::Done);
        assert_eq!(state.claim_run(generation), Claim::Run(RunClaim::Pending));
        assert!(state.run_over(generation, RunClaim::Pending));
        state.retire(generation);
    }

    /// Each retire moves the ticket to the next generation, exactly one on, and a call of any
    /// earlier generation (a replay of a graph that captured one of those launches) is skipped and
    /// is never taken by a reclaim, however many launches ago it was. (Mutation testing: with the
    /// generation's mask `(1 << 40) + 1`, generations 0 and 2 were one and a stale call ran the
    /// launch of another; with `next_generation` shifting left, generations jumped by `2^8`.)
    #[test]
    fn a_call_of_any_earlier_generation_is_skipped() {
        let state = LaunchState::new();
        assert_eq!(state.next_generation(), 0);
        for generation in 0..6 {
            assert_eq!(state.next_generation(), generation);
            one_launch(&state, generation);
        }
        let current = state.next_generation();
        assert_eq!(current, 6);
        state.begin(current);
        assert_eq!(state.launched(current), LaunchOver::Done);
        assert_eq!(state.pending_generation(), Some(current));
        for stale in 0..current {
            assert_eq!(state.claim_run(stale), Claim::Skip, "generation {stale}");
            assert!(!state.claim_reclaim(stale), "generation {stale}");
        }
        assert_eq!(state.claim_run(current), Claim::Run(RunClaim::Pending));
    }

    /// The generation wraps at its width: the ticket then starts again at 0 (the bound that
    /// `tickets.rs` documents), and the state beside it is untouched.
    #[test]
    fn the_generation_wraps_at_its_width() {
        let state = LaunchState::new();
        let last = GENERATION_MASK;
        state.begin(last);
        assert!(state.is_pending());
        assert_eq!(state.launched(last), LaunchOver::Done);
        assert_eq!(state.pending_generation(), Some(last));
        assert_eq!(state.claim_run(last), Claim::Run(RunClaim::Pending));
        assert!(state.run_over(last, RunClaim::Pending));
        state.retire(last);
        assert!(!state.is_pending());
        assert_eq!(state.next_generation(), 0);
    }
}
