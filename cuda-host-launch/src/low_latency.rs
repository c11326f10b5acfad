//! The low-latency completion mode: the stream writes a flag into host memory and a poller thread
//! of this crate wakes the futures whose flag is set. No host function is involved, so the wake
//! does not wait for the context's driver thread.
//!
//! - **Flags** live in 4 KiB pages of ordinary host memory (ours, so they stay readable whatever
//!   happens to the context), registered with `cuMemHostRegister(DEVICEMAP | PORTABLE)` in the
//!   stream's context; a completion takes a free 32-bit slot, sets it to 0 and enqueues
//!   `cuStreamWriteValue32(stream, slot, 1)`, which the stream performs once all earlier work has
//!   completed.
//! - **The poller** scans the waiting flags. After progress it spins (a busy core) for
//!   [`SPIN`], then sleeps in growing steps up to [`MAX_SLEEP`]; a new registration wakes it. With
//!   nothing waiting for [`IDLE_EXIT`] it exits: no thread when no future waits. Its CPU time is
//!   counted ([`poller_cpu_time`]).
//! - **A lost context** (reset or destroyed after a sticky error: the flag will never be written)
//!   fails its futures when its pending launches are reclaimed ([`fail_context`]), and its pages are
//!   dropped (the driver forgot their registration with the context).

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_sys::types::{CUcontext, CUdeviceptr};

use crate::completion::Shared;
use crate::error::Error;
use crate::raw_stream::AsRawStream;

/// Spinning time after the last progress before the poller starts to sleep.
pub const SPIN: Duration = Duration::from_micros(200);
/// The longest sleep between scans while futures wait.
pub const MAX_SLEEP: Duration = Duration::from_millis(1);
/// The poller exits after this long with nothing waiting.
pub const IDLE_EXIT: Duration = Duration::from_millis(100);

const PAGE_BYTES: usize = 4096;
const SLOTS_PER_PAGE: usize = PAGE_BYTES / 4;

/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`.
const REGISTER_FLAGS: u32 = 0x01 | 0x02;

/// One page of flags, registered in one context.
struct Page {
    host: NonNull<AtomicU32>,
    device: CUdeviceptr,
    /// Free slot indices; guarded by the registry lock.
    free: Mutex<Vec<u16>>,
}

// SAFETY: the page is plain host memory read and written through atomics; the registry owns it.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn flag(&self, slot: u16) -> &AtomicU32 {
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

/// A waiting future: its flag and shared state.
struct Entry {
    page: Arc<Page>,
    slot: u16,
    context: usize,
    shared: Arc<Shared<()>>,
}

struct Registry {
    /// Pages by context.
    pages: BTreeMap<usize, Vec<Arc<Page>>>,
    /// Entries registered since the poller last looked.
    incoming: Vec<Entry>,
    /// Contexts whose entries must fail.
    lost: Vec<usize>,
    /// Whether a poller thread is running, and its handle to wake it.
    poller: Option<std::thread::Thread>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pages: BTreeMap::new(),
    incoming: Vec::new(),
    lost: Vec::new(),
    poller: None,
});

static POLLER_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// Pages that stayed registered after their unregistration failed: kept (not freed, so their
/// addresses are never reused) and listed here, for as long as the process lives.
static QUARANTINE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// CPU time the low-latency poller threads have used so far.
pub fn poller_cpu_time() -> Duration {
    Duration::from_nanos(POLLER_CPU_NS.load(Ordering::Relaxed))
}

/// Enqueues the flag write for `shared` on `stream` and hands it to the poller.
pub(crate) fn register(stream: &impl AsRawStream, shared: Arc<Shared<()>>) -> Result<(), Error> {
    if crate::in_host_function() {
        return Err(Error::InsideHostFunction {
            operation: "creating a completion",
        });
    }
    crate::forked_child::check()?;
    let driver = cuda_sys::driver()?;
    let write = driver.raw().cuStreamWriteValue32()?;
    let raw = stream.as_raw_stream();
    let context = crate::launch::context_of(driver, raw, stream.context_hint())?;
    let (page, slot) = take_slot(driver, context)?;
    page.flag(slot).store(0, Ordering::Relaxed);
    let address = page.device + 4 * u64::from(slot);
    // SAFETY: the stream is valid (the `AsRawStream` contract); `address` is a registered, mapped
    // 32-bit slot of ours that stays allocated while the entry holds its page.
    let code = unsafe { write(raw, address, 1, 0) };
    if let Err(e) = driver.check(code, "cuStreamWriteValue32") {
        free_slot(&page, slot);
        return Err(e.into());
    }
    let mut reg = registry();
    reg.incoming.push(Entry {
        page,
        slot,
        context: context.addr(),
        shared,
    });
    match &reg.poller {
        Some(thread) => thread.unpark(),
        None => {
            let thread = std::thread::Builder::new()
                .name("cuda-host-launch-poller".into())
                .spawn(poll_loop)
                .map_err(|e| Error::ReaperSpawn(e.to_string()))?;
            reg.poller = Some(thread.thread().clone());
        }
    }
    Ok(())
}

fn take_slot(driver: &cuda_sys::Driver, context: CUcontext) -> Result<(Arc<Page>, u16), Error> {
    let mut reg = registry();
    let pages = reg.pages.entry(context.addr()).or_default();
    for page in pages.iter() {
        let mut free = page.free.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = free.pop() {
            return Ok((Arc::clone(page), slot));
        }
    }
    let page = Arc::new(new_page(driver, context)?);
    let slot = page
        .free
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
        .unwrap_or(0);
    pages.push(Arc::clone(&page));
    Ok((page, slot))
}

fn free_slot(page: &Page, slot: u16) {
    page.free
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(slot);
}

fn new_page(driver: &cuda_sys::Driver, context: CUcontext) -> Result<Page, Error> {
    let layout = page_layout();
    // SAFETY: a non-zero size.
    let host = unsafe { std::alloc::alloc_zeroed(layout) };
    let Some(host) = NonNull::new(host.cast::<AtomicU32>()) else {
        std::alloc::handle_alloc_error(layout);
    };
    let mut device = 0;
    let mut registered = false;
    // Register in the stream's context (pushed for the calls, then popped).
    let result = (|| -> Result<(), cuda_sys::Error> {
        // SAFETY: a context handle from the driver (the stream's).
        unsafe { driver.cuCtxPushCurrent(context)? };
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
        let mut popped = std::ptr::null_mut();
        // SAFETY: we pushed a context above.
        let _ = unsafe { driver.cuCtxPopCurrent(&mut popped) };
        result
    })();
    if let Err(e) = result {
        if !registered {
            // SAFETY: allocated above with `layout`, never shared, registered no more.
            unsafe { std::alloc::dealloc(host.as_ptr().cast(), layout) };
        } else {
            // Still registered (the unregister failed too): the page is kept rather than handed
            // back to the allocator, where a later registration at its address would fail.
            QUARANTINE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(host.as_ptr().addr());
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

/// Fails every waiting future of `context` (its flags will never be written: the context was reset
/// or destroyed) and forgets its pages. Called when its pending launches are reclaimed.
pub(crate) fn fail_context(context: CUcontext) {
    let mut reg = registry();
    reg.pages.remove(&context.addr());
    if reg.poller.is_some() {
        reg.lost.push(context.addr());
        if let Some(thread) = &reg.poller {
            thread.unpark();
        }
    }
}

fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

fn poll_loop() {
    // Wakers are users' code: never in the default capture interaction (see `relaxed_capture`).
    // The driver is loaded (`register` used it before starting this thread).
    let _ = crate::relaxed_capture::enter_relaxed_mode();
    let cpu_start = thread_cpu_time();
    let mut cpu_counted = Duration::ZERO;
    let mut waiting: Vec<Entry> = Vec::new();
    let mut last_progress = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut sleep = Duration::from_micros(10);
    loop {
        let lost = {
            let mut reg = registry();
            waiting.append(&mut reg.incoming);
            if waiting.is_empty() {
                let idle = *idle_since.get_or_insert_with(Instant::now);
                if idle.elapsed() >= IDLE_EXIT {
                    reg.poller = None;
                    reg.lost.clear();
                    break;
                }
            } else {
                idle_since = None;
            }
            std::mem::take(&mut reg.lost)
        };
        let before = waiting.len();
        waiting.retain(|entry| {
            if entry.page.flag(entry.slot).load(Ordering::Acquire) != 0 {
                entry.shared.complete(Ok(()));
                free_slot(&entry.page, entry.slot);
                return false;
            }
            if lost.contains(&entry.context) {
                entry.shared.fail();
                return false;
            }
            true
        });
        let now = Instant::now();
        if waiting.len() < before {
            last_progress = now;
            sleep = Duration::from_micros(10);
        }
        let used = thread_cpu_time().saturating_sub(cpu_start);
        POLLER_CPU_NS.fetch_add(
            used.saturating_sub(cpu_counted).as_nanos() as u64,
            Ordering::Relaxed,
        );
        cpu_counted = used;
        if waiting.is_empty() {
            std::thread::park_timeout(IDLE_EXIT);
        } else if now.duration_since(last_progress) < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::park_timeout(sleep);
            sleep = (sleep * 2).min(MAX_SLEEP);
        }
    }
    let used = thread_cpu_time().saturating_sub(cpu_start);
    POLLER_CPU_NS.fetch_add(
        used.saturating_sub(cpu_counted).as_nanos() as u64,
        Ordering::Relaxed,
    );
}
