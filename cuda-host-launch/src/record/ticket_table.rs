//! The ticket table: the slots that name run-once launches to the driver, and the atomic half of
//! the launch protocol on them (a launcher's take, the trampoline's run, a reclaim's walk and claim,
//! the give-back on release). `tickets.rs` holds the process's one table; the loom models
//! (`loom_models::tickets`) check this code with small tables of their own.
//!
//! A ticket is a slot of a table that is never freed while the table lives (the process's lives as
//! long as the process): its [`LaunchState`] (generation and state), the record and the context of
//! the launch that holds it. The driver is handed the ticket's index and the launch's generation
//! ([`TicketId`]), so the trampoline can always look at the ticket, whatever happened to the
//! record, and a call of an old generation (a replay of a graph that captured a launch long
//! released) is recognised and does nothing.
//!
//! - Indices: `1..CHUNKS << CHUNK_BITS` (index 0 unused so that no `userData` is null), in chunks
//!   of `1 << CHUNK_BITS` tickets allocated on first use.
//! - Each thread keeps a small cache of free indices ([`FreeCache`]); a releasing thread's cache
//!   spills `BATCH` of them to the table's list under a mutex, from which launching threads refill.
//! - A walk ([`TicketTable::pending_in`], [`TicketTable::for_each`]) looks at every ticket handed
//!   out so far: atomics only, no lock.
//!
//! **Who reads what, in which order.** A launcher writes the record and the context (Relaxed),
//! then the state's new generation (`begin`, Release). A claim (the trampoline's, a reclaim's) is
//! a compare-and-swap on the state (Acquire), so the record it then reads is its generation's. A
//! walk reads the state first (Acquire), then the context: the context of that generation or a
//! later one (the ticket may have been reused since), which is harmless, since the claim that
//! follows names the generation and fails for any other.

use std::ptr;

use super::launch_state::{Claim, LaunchOver, LaunchState};
use super::ticket_id::TicketId;
use crate::support::sync::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering, lock};

/// One launch's slot.
pub(crate) struct Ticket {
    /// The launch's generation and ownership state.
    pub(crate) state: LaunchState,
    /// Written by the launcher before its launch begins; read by whoever claims it.
    record: AtomicPtr<()>,
    /// Written by the launcher before its launch begins; read by a walk.
    context: AtomicUsize,
    /// The context's `cuCtxGetId` (0 before 12.0): the handle alone may name a later context.
    context_id: AtomicU64,
}

impl Ticket {
    fn new() -> Ticket {
        Ticket {
            state: LaunchState::new(),
            record: AtomicPtr::new(ptr::null_mut()),
            context: AtomicUsize::new(0),
            context_id: AtomicU64::new(0),
        }
    }

    /// The record of the launch whose generation the caller claimed (or holds).
    fn record(&self) -> *mut () {
        // Written before the launch began (Release), read after a claim (Acquire).
        self.record.load(Ordering::Relaxed)
    }

    /// The context handle and id of the launch whose generation the caller saw pending (or of a
    /// later launch of this ticket: see the module's docs).
    pub(crate) fn context(&self) -> (usize, u64) {
        (
            self.context.load(Ordering::Relaxed),
            self.context_id.load(Ordering::Relaxed),
        )
    }
}

/// A launch a walk found pending: the ticket, the generation it saw, and that launch's context
/// (handle, id) as read after it.
pub(crate) struct Candidate<'t> {
    ticket: &'t Ticket,
    generation: u64,
    /// The context's handle and id.
    pub(crate) context: (usize, u64),
}

/// A ticket its launcher holds (LAUNCHING) until its launch call returned.
pub(crate) struct HeldTicket<'t> {
    /// The id the driver gets as `userData`, and the record's to give back on release.
    pub(crate) id: TicketId,
    ticket: &'t Ticket,
}

impl HeldTicket<'_> {
    /// The launch call returned success: hands the launch over to the driver's thread (or tells
    /// the launcher to queue the record, if its host function already ran).
    pub(crate) fn launched(self) -> LaunchOver {
        self.ticket.state.launched(self.id.generation())
    }
}

/// A thread's free indices. The process's caches live in a `thread_local!` that gives them back
/// to its table when the thread exits ([`TicketTable::spill`]).
pub(crate) struct FreeCache(Vec<u32>);

impl FreeCache {
    pub(crate) const fn new() -> FreeCache {
        FreeCache(Vec::new())
    }
}

/// A table of `CHUNKS` chunks of `1 << CHUNK_BITS` tickets; free indices move between a thread's
/// cache and the table's list `BATCH` at a time.
pub(crate) struct TicketTable<const CHUNK_BITS: u32, const CHUNKS: usize, const BATCH: usize> {
    /// The chunks; a chunk, once stored, is never freed or replaced while the table lives.
    directory: [AtomicPtr<Ticket>; CHUNKS],
    /// Indices handed out so far are `1..high`; their chunks are allocated.
    high: AtomicU32,
    /// Guards growing (a new index, a new chunk).
    grow: Mutex<()>,
    /// Free indices not in any thread's cache.
    free: Mutex<Vec<u32>>,
}

impl<const CHUNK_BITS: u32, const CHUNKS: usize, const BATCH: usize>
    TicketTable<CHUNK_BITS, CHUNKS, BATCH>
{
    const CHUNK_LEN: usize = 1 << CHUNK_BITS;

    /// An empty table.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        TicketTable {
            directory: [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS],
            high: AtomicU32::new(1),
            grow: Mutex::new(()),
            free: Mutex::new(Vec::new()),
        }
    }

    /// An empty table (loom's atomics and locks are not `const`).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        TicketTable {
            directory: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            high: AtomicU32::new(1),
            grow: Mutex::new(()),
            free: Mutex::new(Vec::new()),
        }
    }

    /// The ticket at `index`, if it was ever handed out.
    #[inline]
    pub(crate) fn ticket(&self, index: u32) -> Option<&Ticket> {
        let chunk = self
            .directory
            .get(index as usize >> CHUNK_BITS)?
            .load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a stored chunk holds CHUNK_LEN tickets and lives as long as the table; the
        // offset is below CHUNK_LEN.
        Some(unsafe { &*chunk.add(index as usize & (Self::CHUNK_LEN - 1)) })
    }

    /// Takes a ticket for a launch of `record` into the context (`handle`, `id`), and holds it
    /// (LAUNCHING): from `cache` (the calling thread's, `None` while it exits), else a batch from
    /// the table's list, else a new index. `None` if every ticket is in use.
    pub(crate) fn take(
        &self,
        cache: Option<&mut FreeCache>,
        record: *mut (),
        (handle, id): (usize, u64),
    ) -> Option<HeldTicket<'_>> {
        let index = match cache {
            Some(cache) => {
                if cache.0.is_empty() {
                    let mut free = lock(&self.free);
                    let from = free.len().saturating_sub(BATCH);
                    cache.0.extend(free.drain(from..));
                }
                cache.0.pop()
            }
            None => lock(&self.free).pop(),
        };
        let index = match index {
            Some(index) => index,
            None => self.new_index()?,
        };
        let ticket = self.ticket(index)?;
        let generation = ticket.state.next_generation();
        ticket.record.store(record, Ordering::Relaxed);
        ticket.context.store(handle, Ordering::Relaxed);
        ticket.context_id.store(id, Ordering::Relaxed);
        // Release: the record and context above are seen by whoever sees this generation.
        ticket.state.begin(generation);
        Some(HeldTicket {
            id: TicketId::new(index, generation)?,
            ticket,
        })
    }

    /// An index never handed out before, with its chunk allocated.
    #[cold]
    fn new_index(&self) -> Option<u32> {
        let _grow = lock(&self.grow);
        let index = self.high.load(Ordering::Relaxed);
        let slot = self.directory.get(index as usize >> CHUNK_BITS)?;
        if slot.load(Ordering::Relaxed).is_null() {
            let chunk: Box<[Ticket]> = (0..Self::CHUNK_LEN).map(|_| Ticket::new()).collect();
            // Kept until the table is dropped (the process's never is): a late call of the driver
            // (a replay of a graph that captured a launch) may look at any ticket at any time.
            slot.store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
        }
        self.high.store(index + 1, Ordering::Release);
        Some(index)
    }

    /// Runs the launch of ticket `id` once, if this call wins it: claims it (one compare-and-swap,
    /// which a reclaim races; a call of another generation finds nothing to claim and touches only
    /// the ticket), hands its record to `run`, then hands the record to `release` unless its
    /// launcher still holds it (see `launch_state`). Takes no lock and allocates nothing.
    #[inline(always)]
    pub(crate) fn run(
        &self,
        id: TicketId,
        run: impl FnOnce(*mut ()),
        release: impl FnOnce(*mut ()),
    ) {
        let Some(ticket) = self.ticket(id.index()) else {
            return;
        };
        let Claim::Run(claim) = ticket.state.claim_run(id.generation()) else {
            return;
        };
        let record = ticket.record();
        // The claim makes the launch's record this call's to run, once.
        run(record);
        if ticket.state.run_over(id.generation(), claim) {
            // No one else holds the record any more.
            release(record);
        }
    }

    /// The launches pending now (launched, not claimed) whose context handle is `handle`.
    pub(crate) fn pending_in(&self, handle: usize) -> Vec<Candidate<'_>> {
        let mut candidates = Vec::new();
        self.for_each(|ticket| {
            if let Some(generation) = ticket.state.pending_generation() {
                let context = ticket.context();
                if context.0 == handle {
                    candidates.push(Candidate {
                        ticket,
                        generation,
                        context,
                    });
                }
            }
        });
        candidates
    }

    /// Calls `f` with the context (handle, id) of every launch in progress or pending now (a
    /// snapshot: a count's look). The state is read first (Acquire), so the context is the one of
    /// that launch or of a later one of the ticket.
    pub(crate) fn for_each_pending(&self, mut f: impl FnMut((usize, u64))) {
        self.for_each(|ticket| {
            if ticket.state.is_pending() {
                f(ticket.context());
            }
        });
    }

    /// A reclaim's claim of a launch a walk found: its record, if the claim won (the launch was
    /// still pending in that generation; the caller owns the record from here). The caller must
    /// know that the driver will never run it (its context is gone).
    pub(crate) fn reclaim(&self, candidate: Candidate<'_>) -> Option<*mut ()> {
        candidate
            .ticket
            .state
            .claim_reclaim(candidate.generation)
            .then(|| candidate.ticket.record())
    }

    /// Gives the ticket `id` back once the record of its launch is released (or about to be, by
    /// the caller): a later call of its generation does nothing. Into `cache` (the calling
    /// thread's), which spills a batch to the table's list when it holds `2 * BATCH`; or, with
    /// `None` (the thread is exiting), to the list.
    pub(crate) fn give_back(&self, cache: Option<&mut FreeCache>, id: TicketId) {
        let Some(ticket) = self.ticket(id.index()) else {
            return;
        };
        ticket.state.retire(id.generation());
        match cache {
            Some(cache) => {
                cache.0.push(id.index());
                if cache.0.len() >= 2 * BATCH {
                    let from = cache.0.len() - BATCH;
                    lock(&self.free).extend(cache.0.drain(from..));
                }
            }
            None => lock(&self.free).push(id.index()),
        }
    }

    /// Gives every index of `cache` back to the table's list (a thread's exit).
    pub(crate) fn spill(&self, cache: &mut FreeCache) {
        lock(&self.free).append(&mut cache.0);
    }

    /// Calls `f` with every ticket handed out so far (some free, some in use).
    pub(crate) fn for_each<'t>(&'t self, mut f: impl FnMut(&'t Ticket)) {
        let high = self.high.load(Ordering::Acquire);
        for index in 1..high {
            if let Some(ticket) = self.ticket(index) {
                f(ticket);
            }
        }
    }

    /// The memory the tickets hold: every chunk allocated so far.
    pub(crate) fn memory_bytes(&self) -> usize {
        let handed_out = self.high.load(Ordering::Acquire) as usize;
        handed_out.div_ceil(Self::CHUNK_LEN) * Self::CHUNK_LEN * size_of::<Ticket>()
    }

    /// How many indices the table's list holds (tests).
    #[cfg(test)]
    pub(crate) fn free_listed(&self) -> Vec<u32> {
        lock(&self.free).clone()
    }
}

impl<const CHUNK_BITS: u32, const CHUNKS: usize, const BATCH: usize> Drop
    for TicketTable<CHUNK_BITS, CHUNKS, BATCH>
{
    /// Frees the chunks (a model's table; the process's table is a `static`, never dropped).
    fn drop(&mut self) {
        for slot in &self.directory {
            let chunk = slot.load(Ordering::Relaxed);
            if !chunk.is_null() {
                // SAFETY: stored by `new_index` from a leaked `Box<[Ticket]>` of CHUNK_LEN
                // tickets; nobody can look at it any more (the table is being dropped).
                drop(unsafe {
                    Box::from_raw(ptr::slice_from_raw_parts_mut(chunk, Self::CHUNK_LEN))
                });
            }
        }
    }
}

// Outside the loom models (`loom_models::tickets` checks the concurrent paths).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Two chunks of two tickets (indices 1, 2 and 3), free indices moved one at a time.
    type Small = TicketTable<1, 2, 1>;

    /// A small table hands out each of its indices once, then refuses; a cache of two free
    /// indices spills one to the table's list (a batch), from which another thread refills; the
    /// chunks are freed with the table. (Mutation testing: with the spill at `2 + BATCH`, or
    /// taking `len / BATCH` onwards, nothing reached the list; with the drop's null check
    /// inverted, it freed chunks never allocated.)
    #[test]
    fn a_small_table_fills_refuses_spills_and_drops() {
        let table = Small::new();
        let mut cache = FreeCache::new();
        let record = ptr::without_provenance_mut::<()>(8);
        let held: Vec<TicketId> = (0..3)
            .map(|_| {
                let held = table
                    .take(Some(&mut cache), record, (1, 1))
                    .expect("a ticket");
                let id = held.id;
                assert_eq!(held.launched(), LaunchOver::Done);
                id
            })
            .collect();
        let mut indices: Vec<u32> = held.iter().map(|id| id.index()).collect();
        indices.sort_unstable();
        assert_eq!(indices, [1, 2, 3]);
        assert!(
            table.take(Some(&mut cache), record, (1, 1)).is_none(),
            "a fourth ticket"
        );
        assert_eq!(table.memory_bytes(), 4 * size_of::<Ticket>());
        table.give_back(Some(&mut cache), held[0]);
        assert!(
            table.free_listed().is_empty(),
            "one free index stays in the cache"
        );
        table.give_back(Some(&mut cache), held[1]);
        assert_eq!(
            table.free_listed(),
            [held[1].index()],
            "a batch spilled to the list"
        );
        // Another thread's empty cache refills from the list.
        let mut other = FreeCache::new();
        let again = table
            .take(Some(&mut other), record, (1, 2))
            .expect("a reused ticket")
            .id;
        assert_eq!(again.index(), held[1].index());
        assert_ne!(again.generation(), held[1].generation());
        table.spill(&mut cache);
        assert_eq!(table.free_listed(), [held[0].index()]);
        drop(table);
    }
}
