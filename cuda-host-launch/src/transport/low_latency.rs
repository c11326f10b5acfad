//! The low-latency completion mode: the stream writes a flag into host memory and the watcher thread
//! of this crate wakes the futures whose flag is set. No host function is involved, so the wake
//! does not wait for the context's driver thread.
//!
//! - **Flags** live in 4 KiB pages of ordinary host memory (ours, so they stay readable whatever
//!   happens to the context), registered with `cuMemHostRegister(DEVICEMAP | PORTABLE)` in the
//!   stream's context; a completion takes a free 64-bit slot, sets it to 0 and enqueues
//!   `cuStreamWriteValue64(stream, slot, value)`, which the stream performs once all earlier work
//!   has completed. `value` is new for every completion (a process-wide counter), and the poller
//!   resolves a future only when its slot holds its own value.
//! - **Pages belong to one context**: they are found by the context's handle *and* its
//!   `cuCtxGetId` (CUDA 12.0+), which a context created later at a destroyed one's handle does not
//!   share (the driver forgot the dead context's registrations). The first time a context is seen
//!   at a handle that had pages under another id, those pages (of a destroyed context) are freed.
//!   Drivers without `cuCtxGetId` (before 12.0) could not tell a new context from a destroyed one
//!   at the same handle (its flag write would land in memory the new context never mapped), so the
//!   mode needs 12.0 and returns `DriverTooOld` below it.
//! - **Stream capture**: a completion on a capturing stream is refused with
//!   [`Error::CaptureActive`] (its flag write would become a graph node, written on every replay
//!   and never in stream order). The stream is looked at before the write and again after it: a
//!   capture another thread began in between captured the write; then the completion is refused
//!   too, and its slot is never handed out again (nor its page freed), so the graph's replays
//!   write into a slot nobody watches. A capture that begins and also ends between the two looks
//!   goes unseen: that future resolves only when the graph is replayed, and later replays write
//!   its old value, which resolves no later future of the slot (a later future there could only be
//!   delayed forever if a replay overwrote its value before the poller saw it).
//! - **The watcher** (`transport::watcher`, the crate's one thread that watches completions)
//!   scans the waiting flags ([`FlagWatch`]). This side paces itself with its own [`PACE`]
//!   (`poller_pace`): it spins after news, then looks at pauses that grow with the wait; a new
//!   registration pokes the watcher.
//! - **A lost context** (reset or destroyed after a sticky error: the flag will never be written)
//!   fails its futures when its pending launches are reclaimed ([`fail_gone`]: only contexts that
//!   are gone, by handle and id, see `support::context_key`), and its pages are
//!   dropped (the driver forgot their registration with the context).

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUdeviceptr};

use super::bell::Ring;
use super::completion_state::{CompletionState, Faultable};
use super::poller_pace::{Pace, PollerSettings, Round, Wait};
use crate::enqueue::admit::admit;
use crate::reaper::lane;
use crate::support::capture::{Capture, capture_active, capture_of, captured_since};
use crate::support::context_key::{ContextKey, Gone, Liveness};
use crate::support::error::Error;
use crate::support::panic_report::PanicOrigin;
use crate::support::pushed_context::with_pushed;
use crate::support::raw_stream::{AsRawStream, context_key_of};
use crate::support::sticky_error;
use crate::support::sync::lock;

/// How this side waits (see `poller_pace`): it spins for as long as any flag waits, whatever the
/// wait's length (the low-latency mode: the soonest wake-up, a busy core meanwhile; the watcher is
/// one thread, so one core in all). Its pauses are never used (nor its `idle_exit`: the watcher
/// stops as the configuration says).
const PACE: PollerSettings = PollerSettings {
    spin: Duration::MAX,
    interval: Duration::from_micros(10),
    max_interval: Duration::from_micros(100),
    idle_exit: Duration::from_millis(100),
    // Reading a flag is a load, not a driver call: nothing to space out.
    query_gap: Duration::ZERO,
    // It spins whenever a flag waits.
    learned_spin: false,
};

const PAGE_BYTES: usize = 4096;
const SLOTS_PER_PAGE: usize = PAGE_BYTES / 8;

/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`.
const REGISTER_FLAGS: u32 = 0x01 | 0x02;

/// One page of flags, registered in one context.
struct Page {
    host: NonNull<AtomicU64>,
    device: CUdeviceptr,
    /// Free slot indices; guarded by the registry lock.
    free: Mutex<Vec<u16>>,
}

// SAFETY: the page is plain host memory read and written through atomics; the registry owns it.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn flag(&self, slot: u16) -> &AtomicU64 {
        // SAFETY: `slot` < SLOTS_PER_PAGE; the page is live while any `Arc<Page>` is.
        unsafe { &*self.host.as_ptr().add(usize::from(slot)) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // The registration is not undone here: pages are dropped when their context is lost (the
        // driver forgot the registration) or at exit. Our memory is ours to free.
        let layout = page_layout();
        // SAFETY: allocated with this layout in `new_page`; no slot of it is in use any more (every
        // entry holds an Arc of its page).
        unsafe { std::alloc::dealloc(self.host.as_ptr().cast(), layout) };
    }
}

fn page_layout() -> std::alloc::Layout {
    // 4096 is a power of two and PAGE_BYTES is a multiple of it.
    std::alloc::Layout::from_size_align(PAGE_BYTES, PAGE_BYTES)
        .unwrap_or(std::alloc::Layout::new::<[u8; PAGE_BYTES]>())
}

/// A waiting future: its flag, the value the stream writes there, and its shared state.
struct Entry {
    page: Arc<Page>,
    slot: u16,
    value: u64,
    context: ContextKey,
    shared: Arc<CompletionState<()>>,
}

pub(in crate::transport) struct Registry {
    /// Pages by context.
    pages: BTreeMap<ContextKey, Vec<Arc<Page>>>,
    /// Entries registered since the poller last looked.
    incoming: Vec<Entry>,
    /// Contexts that are gone: their entries must fail.
    lost: Vec<ContextKey>,
    /// The contexts of the entries the poller holds (it updates the list each round, under this
    /// lock), so that a reclaim can collect them before it looks at a handle.
    watched: Vec<ContextKey>,
    /// Futures that wait on a host function, watched for a fault of their context since the
    /// poller last looked ([`watch_for_faults`]).
    faultable: Vec<(ContextKey, Box<dyn Faultable>)>,
    /// Whether the watcher's flag side looks for faults every [`FAULT_LOOK`] already (it holds
    /// futures watched for faults, or flags), as of its last round: a new watched future then
    /// needs no wake-up of its own (set by the watcher under this lock).
    looking: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pages: BTreeMap::new(),
    incoming: Vec::new(),
    lost: Vec::new(),
    watched: Vec::new(),
    faultable: Vec::new(),
    looking: false,
});

/// Watches `future`, which waits on a host function in the context `key`, for a fault of that
/// context: the driver never runs a host function after one, so without this the future would wait
/// until the context's reset. The poller looks every [`FAULT_LOOK`] while any such future waits
/// (parking in between: no spinning for these), and fails them with
/// [`Error::DeviceFault`](crate::Error::DeviceFault). Only primary contexts this crate knows (their
/// handles never dangle); others are not watched.
pub(crate) fn watch_for_faults(key: ContextKey, future: Box<dyn Faultable>) -> Ring {
    if super::primary_release::device_of(key.handle).is_none() {
        return Ring::Heard;
    }
    let mut reg = registry();
    reg.faultable.push((key, future));
    if reg.looking && super::bell::running() {
        // The flag side looks within FAULT_LOOK and takes it then: no wake-up (a host-function
        // future each time would cost the watcher a round).
        return Ring::Heard;
    }
    // Under the registry's lock: the watcher cannot decide to stop meanwhile.
    super::bell::ring_flags()
}

/// The next value a flag write writes: never 0 (a slot's value while it waits), never repeated.
static NEXT_VALUE: AtomicU64 = AtomicU64::new(1);

/// Slots whose flag write a capture took into a graph: never handed out again, and their pages
/// never freed, since every replay of the graph writes there.
static CAPTURED_SLOTS: Mutex<Vec<(Arc<Page>, u16)>> = Mutex::new(Vec::new());

/// Pages that stayed registered after their unregistration failed: kept (not freed, so their
/// addresses are never reused) and listed here, for as long as the process lives.
static QUARANTINE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Registry> {
    lock(&REGISTRY)
}

/// Enqueues the flag write for `shared` on `stream` and hands it to the poller.
pub(crate) fn register(
    stream: &impl AsRawStream,
    shared: Arc<CompletionState<()>>,
) -> Result<Ring, Error> {
    // The lane (the reaper, in reaper mode) is ready before the poller may send it a waker's
    // panic (see `reaper::lane`). No record: nothing for `Admitted::finish` to do.
    let driver = admit("creating a completion")?.driver;
    let write = driver.raw().cuStreamWriteValue64()?;
    let raw = stream.as_raw_stream();
    if let Capture::Active { id, .. } = capture_of(driver, raw)? {
        return Err(capture_active(raw, id));
    }
    let context = context_key_of(driver, stream)?;
    if context.id == 0 {
        // No ids (a driver before 12.0): see the module's docs.
        driver.raw().cuCtxGetId()?;
    }
    let (page, slot) = take_slot(driver, context)?;
    page.flag(slot).store(0, Ordering::Relaxed);
    let value = NEXT_VALUE.fetch_add(1, Ordering::Relaxed);
    let address = page.device + 8 * u64::from(slot);
    // SAFETY: the stream is valid (the `AsRawStream` contract); `address` is a registered, mapped
    // 64-bit slot of ours that stays allocated while the entry holds its page (or, if the write
    // is captured, for as long as the process lives: see `CAPTURED_SLOTS`).
    let code = unsafe { write(raw, address, value, 0) };
    if let Err(e) = driver.check(code, "cuStreamWriteValue64") {
        free_slot(&page, slot);
        return Err(e.into());
    }
    // A capture begun by another thread since the look above took the write into its graph.
    let captured = captured_since(driver, raw);
    if let Some(error) = captured {
        // The slot is the graph's for good.
        lock(&CAPTURED_SLOTS).push((page, slot));
        return Err(error);
    }
    let mut reg = registry();
    reg.incoming.push(Entry {
        page,
        slot,
        value,
        context,
        shared,
    });
    // Under the registry's lock: the watcher cannot decide to stop meanwhile.
    Ok(super::bell::ring_flags())
}

fn take_slot(driver: &cuda_dl_sys::Driver, key: ContextKey) -> Result<(Arc<Page>, u16), Error> {
    let context = key.raw();
    let mut reg = registry();
    if !reg.pages.contains_key(&key) {
        // Pages under this handle with another id are a destroyed context's (two live contexts
        // never share a handle): the driver forgot their registration with it.
        reg.pages
            .retain(|other, _| other.handle != key.handle || other.id == key.id);
    }
    let pages = reg.pages.entry(key).or_default();
    for page in pages.iter() {
        let mut free = lock(&page.free);
        if let Some(slot) = free.pop() {
            return Ok((Arc::clone(page), slot));
        }
    }
    let page = Arc::new(new_page(driver, context)?);
    let slot = lock(&page.free).pop().unwrap_or(0);
    pages.push(Arc::clone(&page));
    Ok((page, slot))
}

fn free_slot(page: &Page, slot: u16) {
    lock(&page.free).push(slot);
}

fn new_page(driver: &cuda_dl_sys::Driver, context: CUcontext) -> Result<Page, Error> {
    let layout = page_layout();
    // SAFETY: a non-zero size.
    let host = unsafe { std::alloc::alloc_zeroed(layout) };
    let Some(host) = NonNull::new(host.cast::<AtomicU64>()) else {
        std::alloc::handle_alloc_error(layout);
    };
    let mut device = 0;
    let mut registered = false;
    // Register in the stream's context (pushed for the calls, then popped).
    let register = || {
        // SAFETY: page-aligned memory of ours, PAGE_BYTES long, registered once.
        let result =
            unsafe { driver.cuMemHostRegister(host.as_ptr().cast(), PAGE_BYTES, REGISTER_FLAGS) }
                .and_then(|()| {
                    registered = true;
                    // SAFETY: the memory was just registered with DEVICEMAP; valid out-pointer.
                    unsafe {
                        driver.cuMemHostGetDevicePointer(&mut device, host.as_ptr().cast(), 0)
                    }
                });
        if result.is_err() && registered {
            // Undo the registration before the memory goes back to the allocator, or a later
            // page at this address would be refused.
            // SAFETY: registered just above, in this (pushed) context.
            if unsafe { driver.cuMemHostUnregister(host.as_ptr().cast()) }.is_ok() {
                registered = false;
            }
        }
        result
    };
    // SAFETY: a context handle from the driver (the stream's). A failed pop is tried once more;
    // its error is not the registration's.
    let result = unsafe { with_pushed(driver, context, register) }
        .and_then(|(result, _pop)| result)
        .map_err(cuda_dl_sys::Error::from);
    if let Err(e) = result {
        if !registered {
            // SAFETY: allocated above with `layout`, never shared, registered no more.
            unsafe { std::alloc::dealloc(host.as_ptr().cast(), layout) };
        } else {
            // Still registered (the unregister failed too): the page is kept rather than handed
            // back to the allocator, where a later registration at its address would fail.
            lock(&QUARANTINE).push(host.as_ptr().addr());
        }
        return Err(e.into());
    }
    let free = (0..SLOTS_PER_PAGE as u16).rev().collect();
    Ok(Page {
        host,
        device,
        free: Mutex::new(free),
    })
}

/// The context handles with low-latency work: pages, and futures waiting.
pub(crate) fn handles() -> Vec<usize> {
    let reg = registry();
    reg.pages
        .keys()
        .map(|key| key.handle)
        .chain(reg.incoming.iter().map(|entry| entry.context.handle))
        .chain(reg.watched.iter().map(|key| key.handle))
        .collect()
}

/// Fails the waiting futures of the contexts of `handle` that are gone (their flags will never be
/// written: see `support::context_key` for `look` and `known`) and forgets their pages. Called
/// when their pending launches are reclaimed.
pub(crate) fn fail_gone(handle: usize, look: &dyn Fn() -> Liveness, known: Gone) {
    let mut reg = registry();
    // The contexts collected first (pages, and entries not yet handed to the poller; the poller's
    // own are judged by the list below), then the handle is looked at.
    let mut keys: Vec<ContextKey> = reg
        .pages
        .keys()
        .copied()
        .chain(reg.incoming.iter().map(|entry| entry.context))
        .filter(|key| key.handle == handle)
        .collect();
    keys.extend(
        reg.watched
            .iter()
            .copied()
            .filter(|key| key.handle == handle),
    );
    if keys.is_empty() {
        return;
    }
    keys.sort_unstable();
    keys.dedup();
    let now = look();
    keys.retain(|key| now.is_gone(*key, known));
    if keys.is_empty() {
        return;
    }
    reg.pages.retain(|key, _| !keys.contains(key));
    // Under the registry's lock, which the watcher holds as it decides to stop: a watcher that
    // runs takes the list in its next round, and so does the one a registration still in
    // `incoming` is about to start (its first round takes both). With neither, nothing waits for
    // these contexts. (Listed only while a watcher ran, a registration whose watcher was not yet
    // running waited for a flag that never came, until a flush.)
    let registered = reg
        .incoming
        .iter()
        .any(|entry| keys.contains(&entry.context));
    if super::bell::running() || registered {
        reg.lost.extend(keys);
        // A watcher that runs hears it; else the registration's caller starts one.
        let _ = super::bell::ring_flags();
    }
}

/// How often the poller looks for a sticky error in the contexts whose flags it waits for (a flag
/// never comes after one): a fault fails their futures within about this long of surfacing.
const FAULT_LOOK: Duration = Duration::from_millis(2);

/// Fails the waiting futures (flags, and host-function futures watched for faults) of every
/// context that has a sticky error ([`sticky_error::probe`]; only primary contexts this crate
/// knows, whose handles never dangle) with [`Error::DeviceFault`](crate::Error::DeviceFault).
/// Their flag slots are not freed (no write will come, but none is reused before the context's
/// pages go with its reclaim); a host-function future's record stays pending for the reclaim.
fn fail_faulted(waiting: &mut Vec<Entry>, faultable: &mut Vec<(ContextKey, Box<dyn Faultable>)>) {
    // Futures that resolved (their host function ran) or were dropped need no look.
    faultable.retain(|(_, future)| future.waits());
    let Some(driver) = cuda_dl_sys::Driver::get() else {
        return;
    };
    let mut contexts: Vec<ContextKey> = waiting
        .iter()
        .map(|entry| entry.context)
        .chain(faultable.iter().map(|(key, _)| *key))
        .collect();
    contexts.sort_unstable();
    contexts.dedup();
    let faulted: Vec<(ContextKey, u32)> = contexts
        .into_iter()
        .filter(|key| super::primary_release::device_of(key.handle).is_some())
        // SAFETY: a primary context's handle, which the driver keeps for the process's life.
        .filter_map(|key| unsafe { sticky_error::probe(driver, key) }.map(|code| (key, code)))
        .collect();
    if faulted.is_empty() {
        return;
    }
    waiting.retain(|entry| {
        let Some(&(_, code)) = faulted.iter().find(|(key, _)| *key == entry.context) else {
            return true;
        };
        if let Some(panic) = entry.shared.fault(code) {
            lane::report_there(PanicOrigin::Waker, panic);
        }
        false
    });
    faultable.retain(|(key, future)| {
        let Some(&(_, code)) = faulted.iter().find(|(faulted, _)| faulted == key) else {
            return true;
        };
        if let Some(panic) = future.fault(code) {
            lane::report_there(PanicOrigin::Waker, panic);
        }
        false
    });
}

/// The flags' side of the watcher (`transport::watcher`): the entries it waits on, the
/// host-function futures it watches for faults, its pace.
pub(in crate::transport) struct FlagWatch {
    pace: Pace,
    waiting: Vec<Entry>,
    faultable: Vec<(ContextKey, Box<dyn Faultable>)>,
    last_fault_look: Instant,
    /// What this side last told the registry ([`Registry::looking`]).
    looking: bool,
    /// A registration came as this side went idle: a round at once.
    recheck: bool,
}

impl FlagWatch {
    pub(in crate::transport) fn new() -> FlagWatch {
        FlagWatch {
            pace: Pace::start(),
            waiting: Vec::new(),
            faultable: Vec::new(),
            last_fault_look: Instant::now(),
            looking: false,
            recheck: false,
        }
    }

    /// Whether nothing waits here (no flag, no host-function future).
    pub(in crate::transport) fn idle(&self) -> bool {
        self.waiting.is_empty() && self.faultable.is_empty()
    }

    /// One round: takes the registrations, wakes the futures whose flag holds their value, fails
    /// those of lost contexts, and every [`FAULT_LOOK`] those of faulted ones. Called inside the
    /// exit gate (the fault look calls the driver). Returns what it saw and how it wants to wait.
    pub(in crate::transport) fn round(&mut self) -> (Round, Option<Wait>) {
        let was_idle = self.waiting.is_empty();
        let (lost, arrived) = {
            let mut reg = registry();
            let arrived = !reg.incoming.is_empty();
            // The contexts of what this thread now holds (kept without allocating while the
            // contexts stay the same; stale ones only make a reclaim look at a handle).
            if self.waiting.is_empty() {
                reg.watched.clear();
            }
            let Registry {
                incoming, watched, ..
            } = &mut *reg;
            for entry in incoming.iter() {
                if !watched.contains(&entry.context) {
                    watched.push(entry.context);
                }
            }
            self.waiting.append(&mut reg.incoming);
            self.faultable.append(&mut reg.faultable);
            reg.looking = !self.idle();
            self.looking = reg.looking;
            self.recheck = false;
            (std::mem::take(&mut reg.lost), arrived)
        };
        let before = self.waiting.len();
        self.waiting.retain(|entry| {
            if entry.page.flag(entry.slot).load(Ordering::Acquire) == entry.value {
                let panicked = entry.shared.complete(Ok(()));
                free_slot(&entry.page, entry.slot);
                if let Some(panic) = panicked {
                    // The handler and the payload are user code: reported on the lane.
                    lane::report_there(PanicOrigin::Waker, panic);
                }
                return false;
            }
            if lost.contains(&entry.context) {
                if let Some(panic) = entry.shared.fail() {
                    lane::report_there(PanicOrigin::Waker, panic);
                }
                return false;
            }
            true
        });
        if !self.idle() && self.last_fault_look.elapsed() >= FAULT_LOOK {
            self.last_fault_look = Instant::now();
            fail_faulted(&mut self.waiting, &mut self.faultable);
        }
        if self.looking && self.idle() {
            // Nothing left to look at: registrations must wake the watcher again. One that came
            // since the start of this round (it found `looking` set and did not) is taken in a
            // round at once.
            let mut reg = registry();
            self.recheck = !reg.incoming.is_empty() || !reg.faultable.is_empty();
            reg.looking = self.recheck;
            self.looking = self.recheck;
        }
        let round = Round {
            progress: self.waiting.len() < before,
            arrived,
            was_idle,
            pending: !self.waiting.is_empty(),
        };
        (round, self.pace.after_round(Instant::now(), round, &PACE))
    }

    /// When this side wants its next round after one that said `wait` (`None`: not before a
    /// registration pokes the watcher): at once while it spins; host-function futures alone need
    /// a look every [`FAULT_LOOK`].
    pub(in crate::transport) fn next_round(&self, wait: Option<Wait>) -> Option<Instant> {
        match wait {
            Some(Wait::Spin) => Some(Instant::now()),
            Some(Wait::Park(pause)) => Some(Instant::now() + pause),
            None if !self.faultable.is_empty() => Some(self.last_fault_look + FAULT_LOOK),
            None if self.recheck => Some(Instant::now()),
            None => None,
        }
    }
}

/// Whether nothing waits in the registry (nothing registered since the last round): with the
/// watcher's [`FlagWatch::idle`], the watcher may stop. Under the registry's lock, which the
/// caller holds while it decides; `lost` is cleared (no one waits for those contexts).
pub(in crate::transport) fn registry_idle(reg: &mut Registry) -> bool {
    if !reg.incoming.is_empty() || !reg.faultable.is_empty() {
        return false;
    }
    reg.looking = false;
    reg.lost.clear();
    true
}

/// The registry's lock, for the watcher's decision to stop.
pub(in crate::transport) fn lock_registry() -> MutexGuard<'static, Registry> {
    registry()
}
