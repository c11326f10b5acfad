//! A hand-over from many threads to one consumer, a slot per thread, so that threads handing over
//! at once never meet on a lock of the process. The event transport's hand-over to the watcher
//! (`transport::event`) is built on it; it is generic (entries `E`, stash keys `K`) so that its
//! loom models (`loom_models::thread_slots`) run this code.
//!
//! - **A slot** holds the entries its thread handed over since the consumer last looked, and a
//!   stash of resources the consumer gave back for this thread's next hand-overs: the watcher
//!   gives a completed entry's event back to the slot of the thread that recorded it, and that
//!   thread's next enqueue of the same context (the key) takes it from there, not from the
//!   context's pool (a lock every thread would take). A stashed event is counted out of its pool,
//!   which so keeps its context; whenever the watcher would give pools back, it first takes the
//!   stashes back ([`Handover::recall`]).
//! - **Numbers.** A slot's number is its thread's (an entry's `thread`: one thread's records on a
//!   stream are in the stream's order). Slots are numbered as they are made, under the registry's
//!   lock, so the registry is in the order of their numbers. A thread whose slot is gone (its
//!   thread-local storage is being torn down) hands over through a shared slot, each entry with a
//!   number of its own (a queue of its own); events of such entries go back to their pool.
//! - **Waking.** The watcher says it waits long ([`Handover::ask_to_be_woken`]) by setting
//!   `wake_on_enqueue`, then looking at every slot; a thread hands over under its slot's lock,
//!   then takes the flag. The slot's lock orders the two: either the watcher sees the entry (and
//!   does not park), or the thread sees the flag (and wakes it). `loom_models::thread_slots` checks
//!   this on this code.
//! - **Stopping.** The watcher decides to stop with the registry's lock and every slot's held
//!   ([`Handover::with_all_locked`]), and a thread hands over and looks whether a watcher runs under its
//!   slot's: either the watcher sees the entry, or the thread sees it stopped and starts the next.
//! - **Gone threads.** A slot whose thread is gone stays until it is empty (its entries taken,
//!   its stash recalled), then the watcher drops it.

use std::sync::Arc;

use crate::support::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering, lock};

/// Events a slot keeps in its stash; more go back to their pools.
pub(crate) const MAX_STASH: usize = 256;

/// What a slot holds, under its lock.
pub(crate) struct Held<E, K> {
    /// Entries handed over since the watcher last looked.
    pub(crate) entries: Vec<E>,
    /// Events whose records completed, for this thread's next enqueues: (context, event). Counted
    /// out of their pools.
    pub(crate) stash: Vec<(K, usize)>,
}

impl<E, K: PartialEq> Held<E, K> {
    /// Takes an event of `context` from the stash.
    pub(crate) fn take_stashed(&mut self, context: K) -> Option<usize> {
        let at = self.stash.iter().rposition(|(key, _)| *key == context)?;
        Some(self.stash.swap_remove(at).1)
    }
}

/// One enqueuing thread's slot.
pub(crate) struct Slot<E, K> {
    /// Its thread's number.
    number: u64,
    held: Mutex<Held<E, K>>,
    /// Whether `held.entries` may have entries: set under the lock by the thread, cleared under
    /// it by the watcher; the watcher locks only slots that have some.
    has_entries: AtomicBool,
}

impl<E, K> Slot<E, K> {
    fn new(number: u64) -> Slot<E, K> {
        Slot {
            number,
            held: Mutex::new(Held {
                entries: Vec::new(),
                stash: Vec::new(),
            }),
            has_entries: AtomicBool::new(false),
        }
    }

    /// Its thread's number.
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// Locks what it holds.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Held<E, K>> {
        lock(&self.held)
    }

    /// Hands `entry` over, under `held` (this slot's lock, which the caller keeps while it rings
    /// the watcher: see the module's docs).
    pub(crate) fn hand_over(&self, held: &mut Held<E, K>, entry: E) {
        held.entries.push(entry);
        self.has_entries.store(true, Ordering::Release);
    }
}

/// The slots, and whether an enqueue must wake the watcher.
pub(crate) struct Handover<E, K> {
    /// Every slot, in the order of their numbers.
    slots: Mutex<Vec<Arc<Slot<E, K>>>>,
    /// The next slot's number (numbers without a slot are taken from it too).
    next: AtomicU64,
    /// Whether the watcher parks, or is about to, for longer than an enqueue should wait: with
    /// nothing pending, or for a pause longer than its shortest (see `transport::poller_pace`).
    /// Only then does an enqueue wake it; otherwise it looks at the slots soon on its own, and an
    /// enqueue makes no system call.
    wake_on_enqueue: AtomicBool,
}

/// Every slot's lock, held (see [`Handover::with_all_locked`]): nothing is handed over meanwhile.
pub(crate) struct AllLocked<'a, 'b, E, K> {
    held: &'b mut [MutexGuard<'a, Held<E, K>>],
}

impl<E, K: Copy> AllLocked<'_, '_, E, K> {
    /// Whether no slot holds an entry.
    pub(crate) fn no_entries(&self) -> bool {
        self.held.iter().all(|held| held.entries.is_empty())
    }

    /// Every entry of every slot, for a look.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &E> {
        self.held.iter().flat_map(|held| held.entries.iter())
    }

    /// Takes every slot's stash, for its events to go back to their pools.
    pub(crate) fn recall(&mut self, mut to_pool: impl FnMut(K, usize)) {
        for held in self.held.iter_mut() {
            for (context, event) in held.stash.drain(..) {
                to_pool(context, event);
            }
        }
    }

    /// Forgets the entries (`context_of` names an entry's context) and stashed events of the
    /// contexts that `gone` says are gone.
    pub(crate) fn forget(&mut self, gone: impl Fn(K) -> bool, context_of: impl Fn(&E) -> K) {
        for held in self.held.iter_mut() {
            held.entries.retain(|entry| !gone(context_of(entry)));
            held.stash.retain(|(context, _)| !gone(*context));
        }
    }
}

impl<E, K: Copy> Handover<E, K> {
    pub(crate) fn new() -> Handover<E, K> {
        Handover {
            slots: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            wake_on_enqueue: AtomicBool::new(false),
        }
    }

    /// Makes a slot for a thread, with a number of its own (taken under the registry's lock: the
    /// registry stays in the order of the numbers).
    pub(crate) fn register(&self) -> Arc<Slot<E, K>> {
        let mut slots = lock(&self.slots);
        let slot = Arc::new(Slot::new(self.number()));
        slots.push(Arc::clone(&slot));
        slot
    }

    /// A number no slot has (for an entry handed over through a shared slot).
    pub(crate) fn number(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// For a thread that handed over, under its slot's lock: whether it must wake the watcher
    /// (which it then does), clearing the flag.
    pub(crate) fn take_wake(&self) -> bool {
        // A load first: every enqueue asks, and a swap would take the flag's cache line from
        // every other enqueuing thread each time, where a load shares it. Only an enqueue that
        // sees the flag set swaps (one of them wins the wake).
        self.wake_on_enqueue.load(Ordering::SeqCst)
            && self.wake_on_enqueue.swap(false, Ordering::SeqCst)
    }

    /// The watcher looks now: no enqueue need wake it.
    pub(crate) fn looking(&self) {
        self.wake_on_enqueue.store(false, Ordering::SeqCst);
    }

    /// The watcher is about to wait long: asks every later hand-over to wake it. False (and
    /// nothing asked) if entries already wait: it must look, not park.
    pub(crate) fn ask_to_be_woken(&self) -> bool {
        self.wake_on_enqueue.store(true, Ordering::SeqCst);
        // Each slot's lock, not its `has_entries` hint: the lock orders this look against a
        // hand-over (see the module's docs).
        let waiting = lock(&self.slots)
            .iter()
            .any(|slot| !slot.lock().entries.is_empty());
        if waiting {
            self.wake_on_enqueue.store(false, Ordering::SeqCst);
        }
        !waiting
    }

    /// For the watcher: every entry handed over, slot by slot, passed to `take`, which moves them
    /// where it keeps them and leaves the vector empty; then drops the slots of threads that are
    /// gone (`gone`: nothing but the registry holds the slot) once they hold nothing. Returns
    /// whether any entry was taken.
    ///
    /// A slot's entries are swapped with `spare` (empty, kept by the caller with its buffer), so
    /// a slot's lock is held for the swap alone, not for `take`'s work: its thread's next
    /// hand-over does not wait for the watcher, and reuses a buffer.
    pub(crate) fn take_entries(
        &self,
        spare: &mut Vec<E>,
        mut take: impl FnMut(&mut Vec<E>),
    ) -> bool {
        let mut slots = lock(&self.slots);
        let mut any = false;
        let mut empty_and_gone = false;
        for slot in slots.iter() {
            if slot.has_entries.load(Ordering::Acquire) {
                {
                    let mut held = slot.lock();
                    slot.has_entries.store(false, Ordering::Relaxed);
                    std::mem::swap(&mut held.entries, spare);
                }
                any |= !spare.is_empty();
                take(spare);
            }
            empty_and_gone |= Arc::strong_count(slot) == 1;
        }
        if empty_and_gone {
            slots.retain(|slot| {
                Arc::strong_count(slot) > 1 || {
                    let held = slot.lock();
                    !held.entries.is_empty() || !held.stash.is_empty()
                }
            });
        }
        any
    }

    /// Gives `events` (each with its thread's number, in any order) back to the stashes of their
    /// threads; those whose thread has no slot, or whose slot's stash is full, go to `to_pool`.
    pub(crate) fn stash(&self, events: &mut [(u64, K, usize)], mut to_pool: impl FnMut(K, usize)) {
        if events.is_empty() {
            return;
        }
        events.sort_unstable_by_key(|&(number, _, _)| number);
        let slots = lock(&self.slots);
        let mut rest = &events[..];
        while let Some(&(number, _, _)) = rest.first() {
            let same = rest.iter().take_while(|(n, _, _)| *n == number).count();
            let (these, later) = rest.split_at(same);
            rest = later;
            match slots.binary_search_by_key(&number, |slot| slot.number) {
                Ok(at) => {
                    let mut held = slots[at].lock();
                    for &(_, context, event) in these {
                        if held.stash.len() < MAX_STASH {
                            held.stash.push((context, event));
                        } else {
                            to_pool(context, event);
                        }
                    }
                }
                Err(_) => {
                    for &(_, context, event) in these {
                        to_pool(context, event);
                    }
                }
            }
        }
    }

    /// Takes every slot's stash back, one slot at a time (for a give-back of idle pools that
    /// decides nothing else: a stash taken by its thread meanwhile is an event out).
    pub(crate) fn recall(&self, mut to_pool: impl FnMut(K, usize)) {
        let slots = lock(&self.slots);
        for slot in slots.iter() {
            for (context, event) in slot.lock().stash.drain(..) {
                to_pool(context, event);
            }
        }
    }

    /// Runs `f` with the registry's lock and every slot's held, taken in the registry's order:
    /// nothing is handed over meanwhile (the watcher decides to stop under them).
    pub(crate) fn with_all_locked<R>(
        &self,
        f: impl FnOnce(&mut AllLocked<'_, '_, E, K>) -> R,
    ) -> R {
        let slots = lock(&self.slots);
        let mut held: Vec<MutexGuard<'_, Held<E, K>>> =
            slots.iter().map(|slot| slot.lock()).collect();
        f(&mut AllLocked { held: &mut held })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Where `stash` puts an event for the slot numbered `number`: `Some` (the key and event)
    /// if it went to the pool, `None` if a slot kept it.
    fn stashed_to_pool(
        handover: &Handover<u32, u8>,
        number: u64,
        event: usize,
    ) -> Option<(u8, usize)> {
        let mut to_pool = None;
        handover.stash(&mut [(number, 1, event)], |key, event| {
            to_pool = Some((key, event))
        });
        to_pool
    }

    #[test]
    fn a_gone_threads_slot_is_dropped_once_it_holds_nothing() {
        let handover = Handover::<u32, u8>::new();
        let (alive, gone) = (handover.register(), handover.register());
        let (alive_number, gone_number) = (alive.number(), gone.number());
        assert!(
            alive_number < gone_number,
            "numbered in the registry's order"
        );
        // A gone thread's slot with a stash stays, and keeps what is given to it.
        assert_eq!(stashed_to_pool(&handover, gone_number, 10), None);
        drop(gone);
        handover.take_entries(&mut Vec::new(), |_| {});
        assert_eq!(
            stashed_to_pool(&handover, gone_number, 11),
            None,
            "dropped with a stash"
        );
        // Taken back, it holds nothing: the next look drops it, and what comes for it goes to the
        // pool.
        let mut recalled = Vec::new();
        handover.recall(|key, event| recalled.push((key, event)));
        assert_eq!(recalled, vec![(1, 10), (1, 11)]);
        handover.take_entries(&mut Vec::new(), |_| {});
        assert_eq!(stashed_to_pool(&handover, gone_number, 12), Some((1, 12)));
        // A live thread's slot stays, empty or not, and its thread takes its stash.
        assert_eq!(stashed_to_pool(&handover, alive_number, 13), None);
        handover.take_entries(&mut Vec::new(), |_| {});
        assert_eq!(alive.lock().take_stashed(1), Some(13));
        assert_eq!(alive.lock().take_stashed(1), None);
        handover.take_entries(&mut Vec::new(), |_| {});
        assert_eq!(
            stashed_to_pool(&handover, alive_number, 14),
            None,
            "a live slot was dropped"
        );
    }

    #[test]
    fn a_gone_threads_entries_are_taken_before_its_slot_goes() {
        let handover = Handover::<u32, u8>::new();
        let slot = handover.register();
        let number = slot.number();
        {
            let mut held = slot.lock();
            slot.hand_over(&mut held, 7);
        }
        drop(slot);
        let mut taken = Vec::new();
        assert!(
            handover.take_entries(&mut Vec::new(), |entries| taken.append(entries)),
            "entries arrived"
        );
        assert_eq!(taken, vec![7]);
        assert!(
            !handover.take_entries(&mut Vec::new(), |entries| taken.append(entries)),
            "nothing arrived"
        );
        assert_eq!(
            stashed_to_pool(&handover, number, 1),
            Some((1, 1)),
            "the slot is gone"
        );
    }

    #[test]
    fn a_full_stash_sends_the_rest_to_the_pool() {
        let handover = Handover::<u32, u8>::new();
        let slot = handover.register();
        let mut events: Vec<(u64, u8, usize)> =
            (0..MAX_STASH + 2).map(|e| (slot.number(), 1, e)).collect();
        let mut to_pool = 0;
        handover.stash(&mut events, |_, _| to_pool += 1);
        assert_eq!(to_pool, 2);
        assert_eq!(slot.lock().stash.len(), MAX_STASH);
    }
}
