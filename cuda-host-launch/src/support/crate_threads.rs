//! The crate's own threads (the reaper, the watcher, the watcher): how they are
//! started, named and placed on CPUs ([`ThreadSettings`], part of the crate's one
//! [`Config`](crate::Config)).
//!
//! A thread inherits the CPU affinity of the thread that starts it. The crate starts its threads
//! from the user's threads (the first launch, the first event enqueue), so a user who pins a
//! launching thread to one core would get the poller and the reaper on that same core, where they
//! take turns with the launcher (`BENCHMARKS.md` gives the cost). By default ([`Affinity::Process`]) a crate thread therefore
//! widens its affinity to every CPU the process may use; a user can pin it, or keep what it
//! inherits, and run code of their own on it first (a priority, a name of their own, a tracing
//! span), as thread-pool builders allow.

use crate::support::config::config;
use crate::support::error::Error;
use crate::support::thread_settings::{Affinity, CrateThread};

/// The name the crate thread `which` gets, as the settings say. The settings' name function is
/// user code, which may call into the crate (even start a thread of it): call this before taking
/// a lock that starts a thread, never under it.
///
/// # Errors
/// The configuration's error ([`Error::InvalidEnvironment`]).
pub(crate) fn name_of(which: CrateThread) -> Result<String, Error> {
    let settings = config()?.thread_settings();
    Ok(settings
        .name
        .as_ref()
        .map_or_else(|| which.default_name().to_string(), |name| name(which)))
}

/// Starts the crate thread `which`, named `name` ([`name_of`]), running `body`, as the settings
/// say; a panic of its start hook goes to `report_hook_panic`.
///
/// # Errors
/// The configuration's error ([`Error::InvalidEnvironment`]), or the operating system's refusal
/// to start a thread ([`Error::ThreadSpawn`]).
pub(crate) fn spawn(
    which: CrateThread,
    name: String,
    body: impl FnOnce() + Send + 'static,
    report_hook_panic: fn(Box<dyn std::any::Any + Send + 'static>),
) -> Result<std::thread::JoinHandle<()>, Error> {
    let settings = config()?.thread_settings().clone();
    // Before the thread exists: its first driver call comes after the exit handler is in place.
    crate::support::exit_gate::arm();
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            CURRENT.with(|current| current.set(Some(which)));
            place(&settings.affinity);
            if let Some(start) = &settings.start {
                // A panicking hook must not stop the crate's thread: it is the user's code, and so is
                // its payload's `Drop` (which may panic again: `drop_quietly`) and the panic
                // handler: `report_hook_panic` says where they run (the lane, for the watcher).
                if let Err(panic) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start(which)))
                {
                    report_hook_panic(panic);
                }
            }
            body();
        })
        .map_err(|e| Error::ThreadSpawn {
            thread: which,
            reason: e.to_string(),
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
