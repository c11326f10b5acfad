//! Support for the `cuda-host-launch` tests against the fake driver: the process's primary context,
//! owners that record how, where and when they are dropped, and where a host function ran.
//!
//! Threads are told apart by `std::thread::current().id()` (this test binary's copy of the
//! standard library, which gives the fake's threads an id of their own the first time they ask,
//! and keeps it) and by the operating system's thread id and name ([`os_thread`]).

use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cuda_host_launch::{Device, PrimaryContext};

use super::{load_fake_driver, os_thread};

/// The name `cuda-host-launch` gives its reaper thread.
pub const REAPER_NAME: &str = "cuda-hl-reaper";

/// How long the helpers here wait for owners before they give up.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Loads the fake driver and returns device 0's primary context, retained once for the whole
/// process (so that tests running in parallel never tear it down under each other).
///
/// # Panics
/// If the fake does not load or the context cannot be retained.
pub fn fake_primary_context() -> Arc<PrimaryContext> {
    static CONTEXT: OnceLock<Arc<PrimaryContext>> = OnceLock::new();
    Arc::clone(CONTEXT.get_or_init(|| {
        load_fake_driver();
        let device = Device::get(0).expect("device 0 of the fake driver");
        PrimaryContext::retain(device).expect("the fake's primary context")
    }))
}

/// Checks the count that [`PrimaryContext::reset`] returned, when `expected` launches of the
/// context were pending and a thread of the crate may hold a retain of it (the event poller, for
/// event work, `release_after`, `spawn_after` or a low-latency future): giving that retain back
/// just after the reset, the poller may release some of the reset context's launches itself, so
/// the reset's count is at most `expected`; whoever released them, none is pending once the reset
/// has returned. (Without such a thread the count is exact: assert it.)
///
/// # Panics
/// If the count is above `expected`, or a launch of the context is still pending.
pub fn assert_reset_released(context: &PrimaryContext, reclaimed: usize, expected: usize) {
    assert!(
        reclaimed <= expected,
        "the reset released {reclaimed} launches, of {expected} pending"
    );
    assert_eq!(
        context.pending_launches(),
        0,
        "launches of the reset context still pending after the reset ({reclaimed} released by it)"
    );
}

/// A thread, as this binary's standard library and the operating system know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    /// `std::thread::current().id()`.
    pub id: ThreadId,
    /// `std::thread::current().name()`: `None` for the fake's threads and other foreign ones.
    pub name: Option<String>,
    /// The operating system's id (on Linux, the `/proc/thread-self` link).
    pub os_id: String,
    /// The operating system's name (cut to 15 bytes on Linux).
    pub os_name: String,
}

impl ThreadInfo {
    /// The calling thread.
    pub fn current() -> ThreadInfo {
        let me = std::thread::current();
        let (os_id, os_name) = os_thread();
        ThreadInfo {
            id: me.id(),
            name: me.name().map(str::to_owned),
            os_id,
            os_name,
        }
    }

    /// Whether this is the same thread as `other`. (By the `std` id: the OS reuses the ids of
    /// threads that have ended.)
    pub fn same_as(&self, other: &ThreadInfo) -> bool {
        self.id == other.id
    }

    /// Whether this is the `cuda-host-launch` reaper thread.
    pub fn is_reaper(&self) -> bool {
        self.name.as_deref() == Some(REAPER_NAME)
    }
}

/// Where a value was dropped, and what a watched flag said then.
#[derive(Debug, Clone)]
pub struct DropRecord {
    /// The dropping thread.
    pub thread: ThreadInfo,
    /// The watched flag at the time (see [`Drops::owner_watching`]); `None` if none was watched.
    pub flag: Option<bool>,
}

/// A family of owners: counts how many were made, how many are still alive, and records every
/// drop. Share it through an `Arc`; make owners with [`Drops::owner`].
#[derive(Debug, Default)]
pub struct Drops {
    made: AtomicUsize,
    live: AtomicIsize,
    records: Mutex<Vec<DropRecord>>,
}

/// An owner of a host launch: records its drop in its [`Drops`].
#[derive(Debug)]
pub struct Owner {
    drops: Arc<Drops>,
    watch: Option<Arc<AtomicBool>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let record = DropRecord {
            thread: ThreadInfo::current(),
            flag: self.watch.as_ref().map(|f| f.load(Ordering::SeqCst)),
        };
        lock(&self.drops.records).push(record);
        self.drops.live.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drops {
    /// A new, empty family.
    pub fn new() -> Arc<Drops> {
        Arc::new(Drops::default())
    }

    /// A new owner of this family.
    pub fn owner(self: &Arc<Self>) -> Owner {
        self.made.fetch_add(1, Ordering::SeqCst);
        self.live.fetch_add(1, Ordering::SeqCst);
        Owner {
            drops: Arc::clone(self),
            watch: None,
        }
    }

    /// A new owner that notes, when it is dropped, what `flag` said (say, "the host function has
    /// returned").
    pub fn owner_watching(self: &Arc<Self>, flag: &Arc<AtomicBool>) -> Owner {
        let mut owner = self.owner();
        owner.watch = Some(Arc::clone(flag));
        owner
    }

    /// Owners made so far.
    pub fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }

    /// Drops so far (counting a double drop twice).
    pub fn dropped(&self) -> usize {
        lock(&self.records).len()
    }

    /// Owners made and not dropped (negative after a double drop).
    pub fn live(&self) -> isize {
        self.live.load(Ordering::SeqCst)
    }

    /// Every drop so far, in order.
    pub fn records(&self) -> Vec<DropRecord> {
        lock(&self.records).clone()
    }

    /// Waits, flushing the cleanup queue, until `n` owners have been dropped (for owners released
    /// asynchronously: through the reaper, or by the driver's user-object destructor thread), then
    /// returns the records. Fails after [`PATIENCE`], or if more than `n` were dropped.
    ///
    /// # Panics
    /// If fewer than `n` are dropped in time or more than `n` are, or if a flush fails.
    #[track_caller]
    pub fn wait_dropped(&self, n: usize) -> Vec<DropRecord> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            cuda_host_launch::flush(PATIENCE).expect("flush");
            let dropped = self.dropped();
            assert!(
                dropped <= n,
                "{dropped} drops, expected {n}: {:?}",
                self.records()
            );
            if dropped == n {
                return self.records();
            }
            assert!(
                Instant::now() < deadline,
                "only {dropped} of {n} owners dropped after {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Threads of this process whose OS name is `name` cut to 15 bytes, as in `/proc/self/task/*/comm`.
pub fn threads_named(name: &str) -> usize {
    let short: String = name.chars().take(15).collect();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == short)
        .count()
}

/// The scheduler states (`R` running, `S` sleeping, ...: the third field of
/// `/proc/self/task/*/stat`) of the threads of this process named `name` (cut to 15 bytes).
pub fn thread_states(name: &str) -> Vec<char> {
    let short: String = name.chars().take(15).collect();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == short)
        })
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            // "pid (comm) S ...": the name may hold spaces and parentheses; the state follows the
            // last ')'.
            stat.rsplit_once(')')?.1.trim_start().chars().next()
        })
        .collect()
}

/// A slot a host function writes the thread it ran on into.
#[derive(Debug, Default)]
pub struct RanOn(Mutex<Vec<ThreadInfo>>);

impl RanOn {
    /// A new, empty slot.
    pub fn new() -> Arc<RanOn> {
        Arc::new(RanOn::default())
    }

    /// Records the calling thread (call it from the host function).
    pub fn here(&self) {
        lock(&self.0).push(ThreadInfo::current());
    }

    /// Every thread recorded, in order.
    pub fn all(&self) -> Vec<ThreadInfo> {
        lock(&self.0).clone()
    }

    /// The one thread recorded (every run on the same thread).
    ///
    /// # Panics
    /// If nothing ran, or runs were on different threads.
    #[track_caller]
    pub fn only(&self) -> ThreadInfo {
        let all = self.all();
        let first = all.first().expect("the host function ran").clone();
        assert!(
            all.iter().all(|t| t.same_as(&first)),
            "ran on several threads: {all:?}"
        );
        first
    }
}
