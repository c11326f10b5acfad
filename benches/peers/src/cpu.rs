//! CPU time: the process's (`getrusage(RUSAGE_SELF)`, dead threads included), the calling
//! thread's (`RUSAGE_THREAD`), and each live thread's by name (`/proc/self/task/*/schedstat`, in
//! ns; `/proc/self/task/*/stat` ticks where schedstat is missing).

use std::collections::HashMap;

/// CPU times at one moment.
pub struct Snapshot {
    process_ns: u64,
    caller_ns: u64,
    threads: HashMap<u32, (String, u64)>,
}

/// CPU used between two snapshots, in ns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    /// The library's own threads (named by the row's prefixes), live at the second snapshot.
    pub library: u64,
    /// The whole process but the measuring (calling) thread: library threads, the driver's
    /// threads, the benchmark's helper threads (the floor's spinner, a parked waiter).
    pub others: u64,
}

impl std::ops::AddAssign for Used {
    fn add_assign(&mut self, other: Used) {
        self.library += other.library;
        self.others += other.others;
    }
}

fn rusage_ns(who: libc::c_int) -> u64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; `who` is RUSAGE_SELF or RUSAGE_THREAD.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime) + us(usage.ru_stime)) * 1000
}

fn thread_ns(tid: &str) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        return text.split_whitespace().next()?.parse().ok();
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The fields after the name (which may hold spaces) start after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000_000 / hz)
}

impl Snapshot {
    pub fn take() -> Snapshot {
        let mut threads = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let tid = task.file_name().to_string_lossy().into_owned();
                let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default();
                if let (Ok(id), Some(ns)) = (tid.parse(), thread_ns(&tid)) {
                    threads.insert(id, (name, ns));
                }
            }
        }
        Snapshot {
            process_ns: rusage_ns(libc::RUSAGE_SELF),
            caller_ns: rusage_ns(libc::RUSAGE_THREAD),
            threads,
        }
    }

    /// What was used from `self` to `later` (the same calling thread took both); `prefixes` name
    /// the library's threads (`comm`, at most 15 characters).
    pub fn used_until(&self, later: &Snapshot, prefixes: &[&str]) -> Used {
        let mut library = 0;
        for (tid, (name, ns)) in &later.threads {
            if prefixes.iter().any(|p| name.starts_with(p)) {
                let before = self.threads.get(tid).map_or(0, |(_, ns)| *ns);
                library += ns.saturating_sub(before);
            }
        }
        let process = later.process_ns.saturating_sub(self.process_ns);
        let caller = later.caller_ns.saturating_sub(self.caller_ns);
        Used {
            library,
            others: process.saturating_sub(caller),
        }
    }

    /// The `top` threads that used the most CPU from `self` to `later`, as shares of `wall_ns`
    /// (the measuring thread named `measuring`), busiest first.
    pub fn busiest(&self, later: &Snapshot, wall_ns: u64, top: usize) -> Vec<(String, f64)> {
        let wall = wall_ns.max(1) as f64;
        let mut shares: Vec<(String, f64)> = later
            .threads
            .iter()
            .map(|(tid, (name, ns))| {
                let before = self.threads.get(tid).map_or(0, |(_, ns)| *ns);
                (name.clone(), ns.saturating_sub(before) as f64 / wall)
            })
            .collect();
        // The measuring thread by its own clock (its schedstat line is in `threads` too, under
        // its name; this one says which it is).
        let caller = later.caller_ns.saturating_sub(self.caller_ns) as f64 / wall;
        shares.push(("(measuring thread, getrusage)".into(), caller));
        shares.sort_by(|a, b| b.1.total_cmp(&a.1));
        shares.truncate(top);
        shares
    }
}
