//! Where a pipelined launch's time goes, thread by thread (`BENCH_THREAD_COSTS=1`).
//!
//! For the floor, our two launch kinds, the peer approach and the parts (a 128-byte block per
//! launch, from a 2 MiB ring, or from a 32 MiB ring in order, written by the host function, or in a
//! scattered order; the floor while a thread of ours works on another core; with
//! `BENCH_THREAD_COSTS_PARTS=buildup`, the floor built up step by step towards our launch), on one
//! stream:
//! what the launching thread, the driver's host-function thread and the reaper each spend per
//! launch while N launches flow (CPU time and run-queue wait from `/proc/.../schedstat`; cycles,
//! user-mode cycles, instructions and last-level-cache misses from `perf_event_open`, where the
//! machine's PMU is visible; the C allocator's calls where `tools/malloc-count`'s shim is
//! preloaded), and how many launches the driver holds pending (enqueued, host
//! function not yet run) as the enqueue goes on, and the host functions' pace while the launcher
//! enqueues and after it has stopped.
//!
//! Every host function here counts its runs (one relaxed `fetch_add` on a line of its own), the
//! floor's included, so that the pending depth can be read; that is the only difference from the
//! table's methods.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUresult;
use cuda_host_launch::{Stream, flush, host_launch, launch_host_function};

use super::{Bench, json_number, quartiles};

/// Host functions run so far (all methods), on a cache line of its own.
#[repr(align(128))]
struct Counter(AtomicU64);
static RAN: Counter = Counter(AtomicU64::new(0));

unsafe extern "C" fn count(_: *mut c_void) {
    RAN.0.fetch_add(1, Ordering::Relaxed);
}

/// A 128-byte block per launch, like a pool record: the launcher writes it, the host function reads
/// one word of it (or, like the trampoline's state flip, adds to it). A ring of `slots` blocks, so a
/// block is written again `slots` launches later: 16,384 (2 MiB) or BIG_RING (32 MiB, more than the
/// records of the 20,000–60,000 launches ours leave pending, so each block is as cold as a record).
const SLOTS: usize = 16_384;
const BIG_RING: usize = 1 << 18;
#[repr(align(128))]
struct Block([AtomicU64; 16]);
static BLOCKS: [Block; BIG_RING] = [const { Block([const { AtomicU64::new(0) }; 16]) }; BIG_RING];

unsafe extern "C" fn count_and_read(data: *mut c_void) {
    // SAFETY: `data` points at one of BLOCKS.
    let block = unsafe { &*data.cast::<Block>() };
    std::hint::black_box(block.0[0].load(Ordering::Relaxed));
    RAN.0.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C" fn count_and_write(data: *mut c_void) {
    // SAFETY: `data` points at one of BLOCKS.
    let block = unsafe { &*data.cast::<Block>() };
    block.0[0].fetch_add(1, Ordering::AcqRel);
    RAN.0.fetch_add(1, Ordering::Relaxed);
}

/// The build-up parts' cleanup queue: their host functions push their block (linked through its
/// word 1) with a compare-and-swap, as the trampoline pushes a record, and a stand-in reaper takes
/// the whole list, walks it and writes each block, as the reaper releases records.
#[repr(align(128))]
struct QueueHead(AtomicU64);
static QUEUE: QueueHead = QueueHead(AtomicU64::new(0));
/// Whether the stand-in reaper is walking a list it took (set before the take).
static STAND_IN_BUSY: AtomicU64 = AtomicU64::new(0);
/// The build-up parts' pending-list lock: taken by the launcher on every launch and by the
/// stand-in reaper once per list it takes, as a shard lock is.
#[repr(align(128))]
struct Shard(Mutex<u64>);
static SHARD: Shard = Shard(Mutex::new(0));
/// Which step the stand-in reaper mimics: 0 idle, else a `Step`'s number.
static STAND_IN_STEP: AtomicU64 = AtomicU64::new(0);

/// Pushes `block` onto the build-up parts' queue (linked through its word 1) with a
/// compare-and-swap, as the trampoline pushes a record; returns the head it replaced (0: the queue
/// was empty).
fn push_block(block: &Block) -> u64 {
    let address = std::ptr::from_ref(block) as u64;
    let mut head = QUEUE.0.load(Ordering::Relaxed);
    loop {
        block.0[1].store(head, Ordering::Relaxed);
        match QUEUE
            .0
            .compare_exchange_weak(head, address, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return head,
            Err(now) => head = now,
        }
    }
}

unsafe extern "C" fn count_read_and_queue(data: *mut c_void) {
    // SAFETY: `data` points at one of BLOCKS.
    let block = unsafe { &*data.cast::<Block>() };
    std::hint::black_box(block.0[0].load(Ordering::Relaxed));
    push_block(block);
    RAN.0.fetch_add(1, Ordering::Relaxed);
}

/// A step of the build-up from the floor towards our owner launch. Steps 1–3 each add one mechanism
/// to the one before, and the step before the first is the floor with a 128-byte block per launch
/// from the 32 MiB ring in order, which reads it (`Footprint(BIG_RING, Blocks::Read)`). Step 4 is
/// step 3 without the lock (our launch as it stands), and step 5 adds one mechanism to step 4.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The host function also pushes its block onto a queue that a stand-in reaper, pinned where
    /// the reaper is, takes whole, walks and writes (polling every 50 µs while it is empty).
    Queue = 1,
    /// And the launcher takes a mutex on every launch, which the stand-in reaper takes once per
    /// list it takes (the pending-list link and unlink).
    Lock = 2,
    /// And the launcher asks the driver whether the stream captures (`cuStreamGetCaptureInfo`).
    CaptureQuery = 3,
    /// The queue and the capture query without the lock: the mechanisms our launch has had since
    /// pooled records stopped being linked into a locked list (`955fd03`).
    QueueCapture = 4,
    /// And the host function does the rest of what the trampoline does around the push: marks its
    /// thread (a thread-local flag set and cleared), flips the block's state (a locked swap on it),
    /// counts the push (a sequentially consistent add on a counter of its own line), and when it
    /// finds the queue empty, fences and unparks the stand-in reaper (which sleeps rather than
    /// parks, as the reaper lingers: one swap, no system call).
    Trampoline = 5,
}

impl Step {
    /// Whether the launcher takes the stand-in shard lock at this step.
    fn locks(self) -> bool {
        matches!(self, Step::Lock | Step::CaptureQuery)
    }

    /// Whether the launcher asks for the stream's capture state at this step.
    fn queries_capture(self) -> bool {
        matches!(
            self,
            Step::CaptureQuery | Step::QueueCapture | Step::Trampoline
        )
    }

    fn from_number(n: u64) -> Option<Step> {
        [
            Step::Queue,
            Step::Lock,
            Step::CaptureQuery,
            Step::QueueCapture,
            Step::Trampoline,
        ]
        .into_iter()
        .find(|&s| s as u64 == n)
    }
}

/// Records pushed by the trampoline step's host function (as the cleanup queue counts them).
static TRAMPOLINE_QUEUED: Counter = Counter(AtomicU64::new(0));
/// The stand-in reaper, for the trampoline step's unpark.
static STAND_IN_THREAD: std::sync::OnceLock<std::thread::Thread> = std::sync::OnceLock::new();

thread_local! {
    /// The trampoline step's thread mark, counted as `HostFunctionScope` counts one.
    static IN_HOST_FUNCTION: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The trampoline step's host function: reads its block, then does what the trampoline does
/// around its push (see [`Step::Trampoline`]).
///
/// # Safety
/// `data` must point at one of `BLOCKS`, pushed onto the queue by no one else.
unsafe extern "C" fn trampoline_like(data: *mut c_void) {
    // SAFETY: `data` points at one of BLOCKS.
    let block = unsafe { &*data.cast::<Block>() };
    IN_HOST_FUNCTION.with(|mark| mark.set(mark.get().saturating_add(1)));
    std::hint::black_box(block.0[0].load(Ordering::Relaxed));
    IN_HOST_FUNCTION.with(|mark| mark.set(mark.get().saturating_sub(1)));
    std::hint::black_box(block.0[3].swap(1, Ordering::AcqRel));
    TRAMPOLINE_QUEUED.0.fetch_add(1, Ordering::SeqCst);
    let head = push_block(block);
    if head == 0 {
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(reaper) = STAND_IN_THREAD.get() {
            reaper.unpark();
        }
    }
    RAN.0.fetch_add(1, Ordering::Relaxed);
}

/// The stand-in reaper of the build-up parts, pinned to `cpu`.
fn stand_in_reaper(cpu: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        super::pin_current_thread(cpu);
        let _ = STAND_IN_THREAD.set(std::thread::current());
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes a plain integer, as `background` does.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64) };
        while BACKGROUND_STOP.load(Ordering::Relaxed) == 0 {
            let Some(step) = Step::from_number(STAND_IN_STEP.load(Ordering::Relaxed)) else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            STAND_IN_BUSY.store(1, Ordering::SeqCst);
            let mut node = QUEUE.0.swap(0, Ordering::Acquire);
            if node == 0 {
                STAND_IN_BUSY.store(0, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            let _shard = step
                .locks()
                .then(|| SHARD.0.lock().unwrap_or_else(|p| p.into_inner()));
            while node != 0 {
                // SAFETY: only addresses of BLOCKS are pushed.
                let block = unsafe { &*(node as *const Block) };
                std::hint::black_box(block.0[0].load(Ordering::Relaxed));
                block.0[2].store(0, Ordering::Relaxed);
                node = block.0[1].load(Ordering::Relaxed);
            }
            drop(_shard);
            STAND_IN_BUSY.store(0, Ordering::SeqCst);
        }
    })
}

/// After a build-up run: waits until the stand-in reaper has walked every block queued, so that
/// the next run does not reuse a block still on its list.
fn drain_stand_in() {
    while QUEUE.0.load(Ordering::SeqCst) != 0 || STAND_IN_BUSY.load(Ordering::SeqCst) != 0 {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// How a footprint part uses its blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blocks {
    /// In ring order; the host function reads.
    Read,
    /// In ring order; the host function adds to the block's first word (a locked instruction).
    Write,
    /// In a scattered order (a multiplicative permutation of the ring); the host function reads.
    Scattered,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Floor,
    Owner,
    Closure,
    Callback,
    /// The floor plus a 128-byte block per launch from a ring of `slots`.
    Footprint(usize, Blocks),
    /// The 32 MiB in-order footprint part built up towards our launch, up to this step.
    BuildUp(Step),
    /// The floor while another thread of ours works on the reaper's CPU (`near`) or on a CPU no
    /// pinned thread uses (far): all the time (`periodic` false) or, like the reaper, in bursts of 15 µs every
    /// 50 µs. Does work on another core slow the pipeline by itself?
    Busy {
        near: bool,
        periodic: bool,
    },
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Floor => "raw cuLaunchHostFunc (floor)".into(),
            Kind::Owner => "launch_host_function + owner".into(),
            Kind::Closure => "host_launch closure".into(),
            Kind::Callback => "cuStreamAddCallback + Box (cust/CCCL)".into(),
            Kind::Footprint(s, Blocks::Read) => format!("  part: floor + 128 B block, ring of {s}"),
            Kind::Footprint(s, Blocks::Write) => {
                format!("  part: floor + 128 B block, ring of {s}, host fn writes")
            }
            Kind::Footprint(s, Blocks::Scattered) => {
                format!("  part: floor + 128 B block, ring of {s}, scattered")
            }
            Kind::BuildUp(Step::Queue) => "  part: ring block + queue, stand-in reaper".into(),
            Kind::BuildUp(Step::Lock) => "  part: ... + a lock per launch".into(),
            Kind::BuildUp(Step::CaptureQuery) => "  part: ... + the capture query".into(),
            Kind::BuildUp(Step::QueueCapture) => "  part: queue + capture query, no lock".into(),
            Kind::BuildUp(Step::Trampoline) => "  part: ... + the trampoline's atomics".into(),
            Kind::Busy { near, periodic } => format!(
                "  part: floor, {} on {}",
                if periodic {
                    "15 us of work per 50 us"
                } else {
                    "a thread busy"
                },
                if near {
                    "the reaper's CPU"
                } else {
                    "a far CPU"
                }
            ),
        }
    }
    fn key(self) -> String {
        match self {
            Kind::Floor => "raw".into(),
            Kind::Owner => "owner".into(),
            Kind::Closure => "closure".into(),
            Kind::Callback => "callback".into(),
            Kind::Footprint(s, Blocks::Read) => format!("raw_with_block_ring_{s}"),
            Kind::Footprint(s, Blocks::Write) => format!("raw_with_block_ring_{s}_written"),
            Kind::Footprint(s, Blocks::Scattered) => format!("raw_with_block_ring_{s}_scattered"),
            Kind::BuildUp(Step::Queue) => "build_up_queue".into(),
            Kind::BuildUp(Step::Lock) => "build_up_queue_lock".into(),
            Kind::BuildUp(Step::CaptureQuery) => "build_up_queue_lock_capture_query".into(),
            Kind::BuildUp(Step::QueueCapture) => "build_up_queue_capture_query".into(),
            Kind::BuildUp(Step::Trampoline) => "build_up_queue_capture_query_trampoline".into(),
            Kind::Busy { near, periodic } => format!(
                "raw_with_{}_{}",
                if periodic {
                    "periodic_work"
                } else {
                    "busy_thread"
                },
                if near { "near" } else { "far" }
            ),
        }
    }
}

const KINDS: [Kind; 11] = [
    Kind::Floor,
    Kind::Owner,
    Kind::Closure,
    Kind::Callback,
    Kind::Footprint(SLOTS, Blocks::Read),
    Kind::Footprint(BIG_RING, Blocks::Read),
    Kind::Footprint(BIG_RING, Blocks::Write),
    Kind::Footprint(BIG_RING, Blocks::Scattered),
    Kind::Busy {
        near: true,
        periodic: false,
    },
    Kind::Busy {
        near: false,
        periodic: false,
    },
    Kind::Busy {
        near: true,
        periodic: true,
    },
];

/// `BENCH_THREAD_COSTS_PARTS=buildup`: the methods, the in-order 32 MiB footprint part and the
/// build-up steps on top of it.
const BUILD_UP_KINDS: [Kind; 10] = [
    Kind::Floor,
    Kind::Owner,
    Kind::Closure,
    Kind::Callback,
    Kind::Footprint(BIG_RING, Blocks::Read),
    Kind::BuildUp(Step::Queue),
    Kind::BuildUp(Step::Lock),
    Kind::BuildUp(Step::CaptureQuery),
    Kind::BuildUp(Step::QueueCapture),
    Kind::BuildUp(Step::Trampoline),
];

/// What the background threads do: 0 nothing (they sleep), 1 work all the time, 2 work in bursts.
static BACKGROUND_MODE: AtomicU64 = AtomicU64::new(0);
/// Which background thread works: 0 the one on the reaper's CPU, 1 the far one.
static BACKGROUND_WHICH: AtomicU64 = AtomicU64::new(0);
static BACKGROUND_STOP: AtomicU64 = AtomicU64::new(0);

/// A background thread pinned to `cpu`: it works (writes through a private 256 KiB buffer, as a
/// reaper walking records would) while the mode asks it to.
fn background(cpu: usize, which: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        super::pin_current_thread(cpu);
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes a plain integer: sleeps end within 1 µs of their
        // deadline, as the reaper's do.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64) };
        let mut buffer = vec![0u64; 32 * 1024];
        let mut i = 0usize;
        let mut work = |for_ns: u64| {
            let started = Instant::now();
            while started.elapsed() < Duration::from_nanos(for_ns) {
                for _ in 0..64 {
                    i = (i + 9) % buffer.len();
                    buffer[i] = buffer[i].wrapping_add(i as u64);
                }
            }
            std::hint::black_box(&buffer);
        };
        while BACKGROUND_STOP.load(Ordering::Relaxed) == 0 {
            let mine = BACKGROUND_WHICH.load(Ordering::Relaxed) == which;
            match BACKGROUND_MODE.load(Ordering::Relaxed) {
                1 if mine => work(100_000),
                2 if mine => {
                    std::thread::sleep(Duration::from_micros(50));
                    work(15_000);
                }
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    })
}

/// Sets what the background threads do for a run of `kind`.
fn set_background(kind: Kind) {
    let (mode, which) = match kind {
        Kind::Busy { near, periodic } => (if periodic { 2 } else { 1 }, u64::from(!near)),
        _ => (0, 0),
    };
    BACKGROUND_WHICH.store(which, Ordering::Relaxed);
    BACKGROUND_MODE.store(mode, Ordering::Relaxed);
    let step = match kind {
        Kind::BuildUp(step) => step as u64,
        _ => 0,
    };
    STAND_IN_STEP.store(step, Ordering::Relaxed);
}

fn launch(bench: &Bench, kind: Kind, stream: &Stream, i: u64) {
    match kind {
        Kind::Floor | Kind::Busy { .. } => {
            let f = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
            // SAFETY: live stream; `count` ignores its argument.
            let code = unsafe { f(stream.raw(), Some(count), std::ptr::null_mut()) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
        }
        Kind::Owner => {
            // SAFETY: `count` ignores its argument.
            unsafe { launch_host_function(stream, Some(count), std::ptr::null_mut(), [i; 2]) }
                .unwrap();
        }
        Kind::Closure => {
            host_launch(stream, move || {
                std::hint::black_box(i);
                RAN.0.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
        Kind::Callback => bench.add_boxed_callback(
            stream,
            Box::new(move || {
                std::hint::black_box(i);
                RAN.0.fetch_add(1, Ordering::Relaxed);
            }),
        ),
        Kind::Footprint(slots, how) => {
            let index = match how {
                // An odd multiplier permutes a power-of-two ring.
                Blocks::Scattered => (i as usize).wrapping_mul(0x9E37_79B1) % slots,
                Blocks::Read | Blocks::Write => i as usize % slots,
            };
            let block = &BLOCKS[index];
            for (k, word) in block.0.iter().enumerate() {
                word.store(i + k as u64, Ordering::Relaxed);
            }
            let f = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
            let data = std::ptr::from_ref(block).cast_mut().cast();
            let host_fn = if how == Blocks::Write {
                count_and_write
            } else {
                count_and_read
            };
            // SAFETY: live stream; both host functions touch only a static block of atomics.
            let code = unsafe { f(stream.raw(), Some(host_fn), data) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
        }
        Kind::BuildUp(step) => {
            if step.queries_capture() {
                bench.capture_query(stream);
            }
            let _shard = step
                .locks()
                .then(|| SHARD.0.lock().unwrap_or_else(|p| p.into_inner()));
            let block = &BLOCKS[i as usize % BIG_RING];
            for (k, word) in block.0.iter().enumerate() {
                word.store(i + k as u64, Ordering::Relaxed);
            }
            drop(_shard);
            let f = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
            let data = std::ptr::from_ref(block).cast_mut().cast();
            // SAFETY: live stream; the host function touches a static block of atomics, the
            // queue's head and static counters (and unparks the stand-in reaper's thread).
            let host_fn = if step == Step::Trampoline {
                trampoline_like
            } else {
                count_read_and_queue
            };
            let code = unsafe { f(stream.raw(), Some(host_fn), data) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
        }
    }
}

/// A hardware or software event counted for one thread (user and kernel mode unless `user_only`).
#[derive(Clone, Copy)]
struct Event {
    name: &'static str,
    kind: u32,
    config: u64,
    user_only: bool,
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_HW_CACHE: u32 = 3;
const PERF_TYPE_SOFTWARE: u32 = 1;
const EVENTS: [Event; 8] = [
    // PERF_COUNT_SW_TASK_CLOCK: the thread's CPU time in ns, exact (schedstat's can lag a tick).
    Event {
        name: "task_clock_ns",
        kind: PERF_TYPE_SOFTWARE,
        config: 1,
        user_only: false,
    },
    // PERF_COUNT_SW_PAGE_FAULTS and PERF_COUNT_SW_CONTEXT_SWITCHES: software events, counted by
    // the kernel even where the PMU is not visible.
    Event {
        name: "page_faults",
        kind: PERF_TYPE_SOFTWARE,
        config: 2,
        user_only: false,
    },
    Event {
        name: "context_switches",
        kind: PERF_TYPE_SOFTWARE,
        config: 3,
        user_only: false,
    },
    Event {
        name: "cycles",
        kind: PERF_TYPE_HARDWARE,
        config: 0,
        user_only: false,
    },
    Event {
        name: "user_cycles",
        kind: PERF_TYPE_HARDWARE,
        config: 0,
        user_only: true,
    },
    Event {
        name: "instructions",
        kind: PERF_TYPE_HARDWARE,
        config: 1,
        user_only: false,
    },
    Event {
        name: "llc_misses",
        kind: PERF_TYPE_HARDWARE,
        config: 3,
        user_only: false,
    },
    // L1 data cache read misses: PERF_COUNT_HW_CACHE_L1D | (READ << 8) | (MISS << 16).
    Event {
        name: "l1d_read_misses",
        kind: PERF_TYPE_HW_CACHE,
        config: 1 << 16,
        user_only: false,
    },
];

/// One open counter (a file descriptor of `perf_event_open`).
struct Counting(i32);

impl Counting {
    /// Counts `event` for thread `tid` on whichever CPU it runs; the error number if the kernel
    /// refuses (no PMU in the guest, `perf_event_paranoid`).
    fn open(event: Event, tid: i64) -> Result<Counting, i32> {
        // perf_event_attr, PERF_ATTR_SIZE_VER5 (112 bytes), written field by field.
        let mut attr = [0u64; 14];
        attr[0] = u64::from(event.kind) | (112u64 << 32); // type, size
        attr[1] = event.config;
        attr[4] = 1 | 2; // read_format: TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING
        // flags: exclude_hv (bit 6), and exclude_kernel (bit 5) for user-only events.
        attr[5] = (1 << 6) | if event.user_only { 1 << 5 } else { 0 };
        // SAFETY: `attr` is a valid perf_event_attr of the size it declares; the other arguments
        // are plain integers (this thread id, any CPU, no group, no flags).
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                tid as libc::pid_t,
                -1i32,
                -1i32,
                0u64,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(Counting(fd as i32))
    }

    /// The count so far, scaled if the kernel multiplexed the counter; `None` if unreadable.
    fn read(&self) -> Option<f64> {
        let mut v = [0u64; 3];
        // SAFETY: a 24-byte buffer for the value, time enabled and time running.
        let n = unsafe { libc::read(self.0, v.as_mut_ptr().cast(), 24) };
        if n != 24 {
            return None;
        }
        if v[2] == 0 {
            return Some(0.0);
        }
        Some(v[0] as f64 * v[1] as f64 / v[2] as f64)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// (CPU ns, run-queue wait ns) of a thread so far, from `/proc/self/task/TID/schedstat`.
fn schedstat(tid: i64) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some((it.next()??, it.next()??))
}

/// `tools/malloc-count`'s readers (the LD_PRELOAD shim that counts the C allocator's calls per
/// thread), if the process runs with it preloaded: totals, and the same per size class.
#[derive(Clone, Copy)]
struct AllocatorCounts {
    read: ReadTotals,
    classes: ReadClasses,
}

/// `malloc_count_read`: a thread's four totals.
type ReadTotals = unsafe extern "C" fn(libc::c_long, *mut [libc::c_ulong; 4]) -> libc::c_int;
/// `malloc_count_classes`: a thread's allocations, reuses and frees per size class.
type ReadClasses = unsafe extern "C" fn(
    libc::c_long,
    *mut [libc::c_ulong; SIZE_CLASSES],
    *mut [libc::c_ulong; SIZE_CLASSES],
    *mut [libc::c_ulong; SIZE_CLASSES],
) -> libc::c_int;

impl AllocatorCounts {
    fn find() -> Option<AllocatorCounts> {
        // SAFETY: RTLD_DEFAULT searches the loaded objects; the names are NUL-terminated.
        let (read, classes) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"malloc_count_read".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"malloc_count_classes".as_ptr()),
            )
        };
        if read.is_null() || classes.is_null() {
            return None;
        }
        // SAFETY: the shim defines both symbols with these signatures
        // (tools/malloc-count/malloc_count.c; SIZE_CLASSES is its CLASSES).
        unsafe {
            Some(AllocatorCounts {
                read: std::mem::transmute::<*mut c_void, ReadTotals>(read),
                classes: std::mem::transmute::<*mut c_void, ReadClasses>(classes),
            })
        }
    }

    /// ALLOCATOR_COUNTS, then allocations, reuses and frees per size class, of thread `tid`.
    fn of(&self, tid: i64) -> Option<Vec<f64>> {
        let mut totals = [0 as libc::c_ulong; 4];
        let mut by_class = [[0 as libc::c_ulong; SIZE_CLASSES]; 3];
        let [allocs, reused, frees] = &mut by_class;
        // SAFETY: each reader takes a thread id and pointers to arrays of the sizes it writes.
        let found = tid > 0
            && unsafe { (self.read)(tid, &mut totals) } == 1
            && unsafe { (self.classes)(tid, allocs, reused, frees) } == 1;
        found.then(|| {
            totals
                .iter()
                .chain(by_class.iter().flatten())
                .map(|&c| c as f64)
                .collect()
        })
    }
}

/// What the shim counts per thread: allocations, frees, allocations that returned one of the
/// thread's own recent frees (a proxy for glibc's thread cache serving it), reallocs.
const ALLOCATOR_COUNTS: [&str; 4] = ["allocs", "frees", "reused", "reallocs"];
/// The shim's size classes: usable size [16k, 16k + 16) bytes, the last one 1,008 bytes and up.
const SIZE_CLASSES: usize = 64;
/// Per size class: allocations, reuses, frees.
const BY_CLASS: [&str; 3] = ["allocs", "reused", "frees"];
/// Readings per thread printed in the thread tables: CPU ns, run-queue wait ns, EVENTS,
/// ALLOCATOR_COUNTS.
const SCALARS: usize = 2 + EVENTS.len() + ALLOCATOR_COUNTS.len();
/// All readings per thread: SCALARS, then BY_CLASS per size class.
const PER_THREAD: usize = SCALARS + BY_CLASS.len() * SIZE_CLASSES;

/// The readings of one thread (see PER_THREAD; NaN where unknown).
fn sample(tid: i64, counters: &[Option<Counting>], allocator: Option<AllocatorCounts>) -> Vec<f64> {
    let (cpu, wait) = schedstat(tid).unwrap_or((f64::NAN, f64::NAN));
    let mut v = vec![cpu, wait];
    v.extend(
        counters
            .iter()
            .map(|c| c.as_ref().and_then(Counting::read).unwrap_or(f64::NAN)),
    );
    match allocator.and_then(|a| a.of(tid)) {
        Some(counts) => v.extend(counts),
        None => v.extend([f64::NAN; PER_THREAD - 2 - EVENTS.len()]),
    }
    v
}

/// Prints, thread by thread, the size classes in which some kind allocated or freed at least 0.02
/// blocks per launch, with every kind's allocations, reuses and frees there.
fn allocator_classes(table: &mut String, kinds: &[Kind], median_of: &dyn Fn(usize, usize) -> f64) {
    let _ = writeln!(
        table,
        "\n  the C allocator's calls by usable size, per launch (medians; tools/malloc-count):"
    );
    for (t, thread) in THREADS.iter().enumerate() {
        let base = LEAD + t * PER_THREAD + SCALARS;
        let (allocs, reused, frees) = (base, base + SIZE_CLASSES, base + 2 * SIZE_CLASSES);
        for c in 0..SIZE_CLASSES {
            let busy = (0..kinds.len())
                .any(|k| median_of(k, allocs + c) >= 0.02 || median_of(k, frees + c) >= 0.02);
            if !busy {
                continue;
            }
            let size = if c + 1 == SIZE_CLASSES {
                format!("{} B and up", 16 * c)
            } else {
                format!("{}-{} B", 16 * c, 16 * c + 15)
            };
            let _ = writeln!(table, "    {thread} thread, usable {size}:");
            for (k, kind) in kinds.iter().enumerate() {
                let _ = writeln!(
                    table,
                    "      {:<52} allocs {:>7.3} (reused {:>7.3})  frees {:>7.3}",
                    kind.name(),
                    median_of(k, allocs + c),
                    median_of(k, reused + c),
                    median_of(k, frees + c)
                );
            }
        }
    }
}

fn per_launch(before: &[f64], after: &[f64], n: usize) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a - b) / n as f64)
        .collect()
}

const THREADS: [&str; 3] = ["launcher", "driver", "reaper"];
/// The figures of a repetition before the threads' readings.
const LEAD: usize = 7;

/// Runs the section; returns the table's text and a JSON object.
pub(super) fn run(
    bench: &Bench,
    stream: &Stream,
    driver_tid: i64,
    reaper_tid: i64,
    reps: usize,
    pinning: Option<&super::Pinning>,
    all_cpus: &[usize],
) -> (String, String) {
    // `BENCH_THREAD_COSTS_N` sets the launches per run (default the table's N);
    // `BENCH_THREAD_COSTS_PARTS=0` leaves out the parts (only the floor and the three methods),
    // `BENCH_THREAD_COSTS_PARTS=footprint` keeps only the 128-byte-block parts, `=buildup` the
    // build-up from the in-order block towards our launch.
    let n: usize = std::env::var("BENCH_THREAD_COSTS_N")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(super::N);
    let parts = std::env::var("BENCH_THREAD_COSTS_PARTS").unwrap_or_default();
    let kinds: &[Kind] = match parts.trim() {
        "0" => &KINDS[..4],
        "footprint" => &KINDS[..8],
        "buildup" => &BUILD_UP_KINDS,
        _ => &KINDS,
    };
    // SAFETY: gettid has no preconditions.
    let launcher_tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tids = [launcher_tid, driver_tid, reaper_tid];
    let reader = AllocatorCounts::find();
    let mut refused = Vec::new();
    let counters: Vec<Vec<Option<Counting>>> = tids
        .iter()
        .map(|&tid| {
            EVENTS
                .iter()
                .map(|&e| match Counting::open(e, tid) {
                    // Unknown thread (not pinned, so its id was not seen): no counters, and never
                    // pid 0, which would count the calling thread.
                    _ if tid <= 0 => None,
                    Ok(c) => Some(c),
                    Err(errno) => {
                        refused.push(format!("{} (tid {tid}): errno {errno}", e.name));
                        None
                    }
                })
                .collect()
        })
        .collect();

    // Near: the reaper's CPU (idle while the floor runs). Far: the last CPU the process may use that
    // none of the pinned threads has.
    let near = pinning.map_or(3, |p| p.reaper);
    let taken = pinning.map_or(vec![], |p| vec![p.launcher, p.driver, p.reaper]);
    let far = all_cpus
        .iter()
        .rev()
        .copied()
        .find(|c| !taken.contains(c))
        .unwrap_or(near);
    let workers = [
        background(near, 0),
        background(far, 1),
        stand_in_reaper(near),
    ];

    // Warm-up.
    for &k in kinds {
        set_background(k);
        for i in 0..20_000 {
            launch(bench, k, stream, i);
        }
        stream.synchronize().unwrap();
        flush(Duration::from_secs(30)).unwrap();
        drain_stand_in();
    }

    // per kind: per rep: enqueue ns, per second, depth at the end of the enqueue, max depth sampled,
    // then per thread the readings per launch.
    let mut figures: Vec<Vec<Vec<f64>>> = vec![Vec::new(); kinds.len()];
    for rep in 0..reps {
        for j in 0..kinds.len() {
            let k = (rep + j) % kinds.len();
            let kind = kinds[k];
            set_background(kind);
            // Let a background thread leave its 1 ms sleep and start.
            std::thread::sleep(Duration::from_millis(3));
            let ran_before = RAN.0.load(Ordering::Relaxed);
            let before: Vec<Vec<f64>> = tids
                .iter()
                .zip(&counters)
                .map(|(&t, c)| sample(t, c, reader))
                .collect();
            let heap_before = cuda_workspace::gpu::heap_in_use();
            let mut max_depth = 0u64;
            let started = Instant::now();
            for i in 0..n {
                launch(bench, kind, stream, i as u64);
                if i % 4_096 == 4_095 {
                    let ran = RAN.0.load(Ordering::Relaxed) - ran_before;
                    max_depth = max_depth.max(i as u64 + 1 - ran);
                }
            }
            let enqueued = started.elapsed();
            let depth = n as u64 - (RAN.0.load(Ordering::Relaxed) - ran_before);
            let heap_growth = cuda_workspace::gpu::heap_in_use() as f64 - heap_before as f64;
            let launcher_after = sample(tids[0], &counters[0], reader);
            stream.synchronize().unwrap();
            let total = started.elapsed();
            let driver_after = sample(tids[1], &counters[1], reader);
            flush(Duration::from_secs(30)).unwrap();
            drain_stand_in();
            let reaper_after = sample(tids[2], &counters[2], reader);
            let mut row = vec![
                enqueued.as_nanos() as f64 / n as f64,
                n as f64 / total.as_secs_f64(),
                depth as f64,
                max_depth.max(depth) as f64,
                // The host functions' pace while the launcher enqueued, and after it stopped.
                enqueued.as_nanos() as f64 / (n as u64 - depth).max(1) as f64,
                (total - enqueued).as_nanos() as f64 / depth.max(1) as f64,
                // Heap (malloc) growth over the enqueue, per launch still pending at its end.
                heap_growth / depth.max(1) as f64,
            ];
            for (b, a) in before
                .iter()
                .zip([launcher_after, driver_after, reaper_after])
            {
                row.extend(per_launch(b, &a, n));
            }
            figures[k].push(row);
        }
    }

    set_background(Kind::Floor);
    BACKGROUND_STOP.store(1, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let columns = LEAD + THREADS.len() * PER_THREAD;
    let median_of = |k: usize, c: usize| {
        let v: Vec<f64> = figures[k].iter().map(|r| r[c]).collect();
        quartiles(&v).0
    };
    // Throughput and enqueue as paired ratios to the floor (kind 0) of the same repetition.
    let paired = |k: usize, c: usize| {
        let v: Vec<f64> = figures[k]
            .iter()
            .zip(&figures[0])
            .map(|(x, f)| x[c] / f[c])
            .collect();
        quartiles(&v).0
    };

    let mut table = String::new();
    let _ = writeln!(
        table,
        "\nbackground threads of the busy parts: near on CPU {near}, far on CPU {far}"
    );
    let _ = writeln!(
        table,
        "\nwhere a launch's time goes, thread by thread (1 stream, N = {n}, {reps} repetitions, kinds \
         interleaved; every host function counts its runs; medians; per launch):"
    );
    let _ = writeln!(
        table,
        "  allocator counts (tools/malloc-count preloaded): {}",
        if reader.is_some() { "yes" } else { "no" }
    );
    if refused.is_empty() {
        let _ = writeln!(table, "  hardware counters: all open");
    } else {
        let _ = writeln!(table, "  hardware counters refused: {}", refused.join("; "));
    }
    let _ = writeln!(
        table,
        "  {:<44} {:>8} {:>7} {:>8} {:>7} {:>9} {:>9} {:>11} {:>11} {:>11}",
        "kind",
        "enq ns",
        "x floor",
        "fns/s",
        "x floor",
        "depth end",
        "depth max",
        "fn ns (enq)",
        "fn ns after",
        "heap B/pend"
    );
    for (k, kind) in kinds.iter().enumerate() {
        let _ = writeln!(
            table,
            "  {:<44} {:>8.0} {:>7.3} {:>8.0} {:>7.3} {:>9.0} {:>9.0} {:>11.0} {:>11.0} {:>11.0}",
            kind.name(),
            median_of(k, 0),
            paired(k, 0),
            median_of(k, 1),
            paired(k, 1),
            median_of(k, 2),
            median_of(k, 3),
            median_of(k, 4),
            median_of(k, 5),
            median_of(k, 6),
        );
    }
    for (t, thread) in THREADS.iter().enumerate() {
        let _ = writeln!(
            table,
            "  {thread} thread (tid {}), per launch: {:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            tids[t],
            "",
            "cpu ns",
            "rq ns",
            "task ns",
            "faults",
            "switches",
            "cycles",
            "u cycles",
            "instr",
            "LLC miss",
            "L1D miss",
            "allocs",
            "frees",
            "reused",
            "reallocs"
        );
        for (k, kind) in kinds.iter().enumerate() {
            let base = LEAD + t * PER_THREAD;
            let mut line = format!("    {:<52}", kind.name());
            for c in 0..SCALARS {
                let _ = write!(line, " {:>8.2}", median_of(k, base + c));
            }
            let _ = writeln!(table, "{line}");
        }
    }

    if reader.is_some() {
        allocator_classes(&mut table, kinds, &median_of);
    }

    let mut json = String::from("{");
    let _ = write!(
        json,
        "\n    \"refused_counters\": {:?},\n    \"columns\": [\"enqueue_ns\", \"per_second\", \"depth_end\", \"depth_max\", \"host_fn_ns_while_enqueuing\", \"host_fn_ns_after\", \"heap_growth_bytes_per_pending\"",
        refused
    );
    for thread in THREADS {
        for name in ["cpu_ns", "runqueue_ns"]
            .iter()
            .chain(EVENTS.iter().map(|e| &e.name))
            .chain(ALLOCATOR_COUNTS.iter())
        {
            let _ = write!(json, ", \"{thread}_{name}\"");
        }
        for what in BY_CLASS {
            for k in 0..SIZE_CLASSES {
                let _ = write!(json, ", \"{thread}_{what}_size_class_{k}\"");
            }
        }
    }
    json.push(']');
    for (k, kind) in kinds.iter().enumerate() {
        let medians: Vec<String> = (0..columns).map(|c| json_number(median_of(k, c))).collect();
        let _ = write!(
            json,
            ",\n    {:?}: {{\"enqueue_ratio\": {}, \"throughput_ratio\": {}, \"medians\": [{}]}}",
            kind.key(),
            json_number(paired(k, 0)),
            json_number(paired(k, 1)),
            medians.join(", ")
        );
    }
    json.push_str("\n  }");
    (table, json)
}
