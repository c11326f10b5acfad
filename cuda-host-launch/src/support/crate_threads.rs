//! The crate's own threads (the reaper, the event poller, the low-latency poller): how they are
//! started, named and placed on CPUs ([`ThreadSettings`], [`set_thread_settings`]).
//!
//! A thread inherits the CPU affinity of the thread that starts it. The crate starts its threads
//! from the user's threads (the first launch, the first event enqueue), so a user who pins a
//! launching thread to one core would get the poller and the reaper on that same core, where they
//! take turns with the launcher (measured on the H200: +230 ns per event enqueue with the default
//! poller, about +1.2 µs spinning). By default ([`Affinity::Process`]) a crate thread therefore
//! widens its affinity to every CPU the process may use; a user can pin it, or keep what it
//! inherits, and run code of their own on it first (a priority, a name of their own, a tracing
//! span), as thread-pool builders allow.

use std::sync::{Arc, RwLock};

use crate::support::panic_report::{PanicOrigin, report_and_drop};

/// Which of the crate's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrateThread {
    /// The cleanup queue's reaper, the crate's lane for user code: drops owners, runs
    /// `spawn_after` callbacks, reports caught panics.
    Reaper,
    /// The event poller: queries events and wakes event futures; it hands everything else to the
    /// reaper (it runs no owner's `Drop` and no callback).
    EventPoller,
    /// The low-latency completions' poller: wakes their futures.
    LowLatencyPoller,
}

impl CrateThread {
    /// Its name unless [`ThreadSettings::name`] says otherwise.
    pub const fn default_name(self) -> &'static str {
        match self {
            CrateThread::Reaper => "cuda-host-launch-reaper",
            CrateThread::EventPoller => "cuda-hl-events",
            CrateThread::LowLatencyPoller => "cuda-host-launch-poller",
        }
    }
}

/// Where a crate thread may run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Affinity {
    /// Every CPU the process may use (its cpuset), whatever the starting thread was pinned to (the
    /// default; on systems other than Linux, as `Inherit`).
    #[default]
    Process,
    /// What the thread that starts it has (the operating system's default).
    Inherit,
    /// These CPUs (indices as the operating system numbers them); CPUs the process may not use
    /// are left out, and if none is left the thread keeps what it inherited.
    Cpus(Vec<usize>),
}

/// Code run on a crate thread as it starts, before it does anything else.
pub type StartHook = Arc<dyn Fn(CrateThread) + Send + Sync>;

/// How the crate starts its threads ([`set_thread_settings`]); threads started before a change
/// keep what they had.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ThreadSettings {
    /// Where each thread may run.
    pub affinity: Affinity,
    /// Each thread's name ([`CrateThread::default_name`] when `None`). On Linux a thread's name
    /// is cut to 15 bytes where the operating system shows it.
    pub name: Option<Arc<dyn Fn(CrateThread) -> String + Send + Sync>>,
    /// Run on each thread as it starts (after its name and affinity are set).
    pub start: Option<StartHook>,
}

impl ThreadSettings {
    /// The defaults: [`Affinity::Process`], the default names, no start hook.
    pub fn new() -> ThreadSettings {
        ThreadSettings::default()
    }

    /// With this affinity.
    pub fn affinity(mut self, affinity: Affinity) -> ThreadSettings {
        self.affinity = affinity;
        self
    }

    /// With names from `name`.
    pub fn name(mut self, name: impl Fn(CrateThread) -> String + Send + Sync + 'static) -> Self {
        self.name = Some(Arc::new(name));
        self
    }

    /// With `start` run on each thread as it starts.
    pub fn on_start(mut self, start: impl Fn(CrateThread) + Send + Sync + 'static) -> Self {
        self.start = Some(Arc::new(start));
        self
    }
}

impl std::fmt::Debug for ThreadSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadSettings")
            .field("affinity", &self.affinity)
            .field("name", &self.name.as_ref().map(|_| "custom"))
            .field("start", &self.start.as_ref().map(|_| "set"))
            .finish()
    }
}

static SETTINGS: RwLock<Option<ThreadSettings>> = RwLock::new(None);

/// Sets how the crate starts its threads from now on (threads already running keep theirs).
pub fn set_thread_settings(settings: ThreadSettings) {
    *SETTINGS.write().unwrap_or_else(|p| p.into_inner()) = Some(settings);
}

/// How the crate starts its threads now.
pub fn thread_settings() -> ThreadSettings {
    SETTINGS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// Starts the crate thread `which` running `body`, as the settings say.
pub(crate) fn spawn(
    which: CrateThread,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    // Before the thread exists: its first driver call comes after the exit handler is in place.
    crate::support::exit_gate::arm();
    let settings = thread_settings();
    let name = settings
        .name
        .as_ref()
        .map_or_else(|| which.default_name().to_string(), |name| name(which));
    std::thread::Builder::new().name(name).spawn(move || {
        CURRENT.with(|current| current.set(Some(which)));
        place(&settings.affinity);
        if let Some(start) = &settings.start {
            // A panicking hook must not stop the crate's thread: it is the user's code, and so is
            // its payload's `Drop` (which may panic again: `drop_quietly`).
            if let Err(panic) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start(which)))
            {
                report_and_drop(PanicOrigin::StartHook, panic);
            }
        }
        body();
    })
}

thread_local! {
    /// Which crate thread the calling thread is, if it is one (set before its start hook runs).
    static CURRENT: std::cell::Cell<Option<CrateThread>> = const { std::cell::Cell::new(None) };
}

/// Which of the crate's threads the calling thread is, if any: `flush` must not wait for a
/// crate thread from that thread itself (its start hook, a waker it calls).
pub(crate) fn current() -> Option<CrateThread> {
    CURRENT.try_with(std::cell::Cell::get).ok().flatten()
}

/// Sets the calling thread's affinity as `affinity` says (best effort: a refusal keeps what it has).
fn place(affinity: &Affinity) {
    #[cfg(target_os = "linux")]
    {
        let allowed = process_cpus();
        let cpus: Vec<usize> = match affinity {
            Affinity::Inherit => return,
            Affinity::Process => allowed,
            Affinity::Cpus(cpus) => cpus
                .iter()
                .copied()
                .filter(|c| allowed.is_empty() || allowed.contains(c))
                .collect(),
        };
        if cpus.is_empty() {
            return;
        }
        // SAFETY: a zeroed cpu_set_t is a valid empty set; only indices below its size are set
        // (`CPU_SET` indexes the set's words, and would panic past them).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for cpu in cpus {
                if cpu < libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(cpu, &mut set);
                }
            }
            let _ = libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = affinity;
}

/// The CPUs the process may use: its cpuset (cgroup v2's `cpuset.cpus.effective`, else v1's), else
/// every CPU the system has online. Empty if none can be read.
#[cfg(target_os = "linux")]
fn process_cpus() -> Vec<usize> {
    let cpuset = [
        "/sys/fs/cgroup/cpuset.cpus.effective",
        "/sys/fs/cgroup/cpuset/cpuset.cpus",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
    .or_else(|| std::fs::read_to_string("/sys/devices/system/cpu/online").ok());
    cpuset.map(|list| parse_cpu_list(&list)).unwrap_or_default()
}

/// A CPU list as Linux writes it (`0-3,8,10-11`).
#[cfg(any(target_os = "linux", test))]
fn parse_cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(first)), None) => cpus.push(first),
            (Some(Ok(first)), Some(Ok(last))) if first <= last => cpus.extend(first..=last),
            _ => {}
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("5"), [5]);
        assert_eq!(parse_cpu_list("3-1,x,2"), [2]);
    }
}
