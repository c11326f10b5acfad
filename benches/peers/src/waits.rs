//! Where threads spend their time when they are not running: a wall-clock sampler of other
//! threads of this process, from outside the libraries (`/proc/self/task/TID/syscall`), and each
//! thread's scheduler counters.
//!
//! Every `period` the sampler reads each watched thread's current system call. A thread on a CPU
//! reads `running`; a blocked one names its call, its arguments, its stack pointer and its program
//! counter. For a blocked thread the sampler then reads the first words above the stack pointer
//! (`process_vm_readv`, which fails cleanly on memory gone meanwhile) and keeps those that point
//! into executable mappings: candidate return addresses, outermost last, as `file+0xOFFSET` with
//! the offset from the file's load address, so that `addr2line -f -C -e FILE 0xOFFSET` names
//! the function (`benches/peers/symbolize-waits`). A stack scan, not an unwinder: a stale word on
//! the stack can appear as a frame, so read the first frames of a stack that recurs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Scheduler counters of the calling thread (`/proc/thread-self`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadCounters {
    /// On a CPU, ns.
    pub run_ns: u64,
    /// Runnable but waiting for a CPU, ns.
    pub queued_ns: u64,
    /// Times it gave the CPU up (blocked).
    pub voluntary: u64,
    /// Times it was preempted.
    pub involuntary: u64,
}

impl ThreadCounters {
    /// The calling thread's counters now (zeros where `/proc` does not say).
    pub fn now() -> ThreadCounters {
        let mut c = ThreadCounters::default();
        if let Ok(text) = std::fs::read_to_string("/proc/thread-self/schedstat") {
            let mut f = text
                .split_whitespace()
                .map(|x| x.parse::<u64>().unwrap_or(0));
            c.run_ns = f.next().unwrap_or(0);
            c.queued_ns = f.next().unwrap_or(0);
        }
        if let Ok(text) = std::fs::read_to_string("/proc/thread-self/status") {
            for line in text.lines() {
                let value = |l: &str| {
                    l.split(':')
                        .nth(1)
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                };
                if line.starts_with("voluntary_ctxt_switches") {
                    c.voluntary = value(line);
                } else if line.starts_with("nonvoluntary_ctxt_switches") {
                    c.involuntary = value(line);
                }
            }
        }
        c
    }

    /// From `self` to `later`.
    pub fn until(&self, later: &ThreadCounters) -> ThreadCounters {
        ThreadCounters {
            run_ns: later.run_ns.saturating_sub(self.run_ns),
            queued_ns: later.queued_ns.saturating_sub(self.queued_ns),
            voluntary: later.voluntary.saturating_sub(self.voluntary),
            involuntary: later.involuntary.saturating_sub(self.involuntary),
        }
    }
}

impl std::ops::AddAssign for ThreadCounters {
    fn add_assign(&mut self, o: ThreadCounters) {
        self.run_ns += o.run_ns;
        self.queued_ns += o.queued_ns;
        self.voluntary += o.voluntary;
        self.involuntary += o.involuntary;
    }
}

/// The calling thread's id, for [`Sampler::start`].
pub fn my_tid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() }
}

/// An executable mapping: `[start, end)` of `file`, whose load address is `base`.
struct Mapping {
    start: usize,
    end: usize,
    base: usize,
    file: String,
}

fn executable_mappings() -> Vec<Mapping> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    // The lowest address each file is mapped at (its first segment: the load address of a
    // shared object or a position-independent executable).
    let mut lowest: HashMap<String, usize> = HashMap::new();
    let mut exec = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with('/') {
            continue;
        }
        let Some((a, b)) = f[0].split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        else {
            continue;
        };
        let file = f[5].to_string();
        let low = lowest.entry(file.clone()).or_insert(start);
        *low = (*low).min(start);
        if f[1].contains('x') {
            exec.push((start, end, file));
        }
    }
    exec.into_iter()
        .map(|(start, end, file)| Mapping {
            start,
            end,
            base: lowest[&file],
            file,
        })
        .collect()
}

fn name_of(mappings: &[Mapping], addr: usize) -> Option<String> {
    let m = mappings.iter().find(|m| m.start <= addr && addr < m.end)?;
    let short = m.file.rsplit('/').next().unwrap_or(&m.file);
    Some(format!("{short}+0x{:x}", addr - m.base))
}

fn syscall_name(nr: i64, args: &[u64]) -> String {
    match nr {
        -1 => "blocked outside a system call".into(),
        0 => "read".into(),
        1 => "write".into(),
        7 => "poll".into(),
        16 => "ioctl".into(),
        24 => "sched_yield".into(),
        35 => "nanosleep".into(),
        202 => {
            let op = args.get(1).copied().unwrap_or(0) & 0x7f;
            let op = match op {
                0 => "WAIT",
                1 => "WAKE",
                9 => "WAIT_BITSET",
                10 => "WAKE_BITSET",
                _ => "other",
            };
            format!("futex {op}")
        }
        230 => "clock_nanosleep".into(),
        232 | 281 => "epoll_wait".into(),
        n => format!("syscall {n}"),
    }
}

/// What the sampler saw: per state (`running`, or the call a thread was blocked in), and per
/// blocked stack.
#[derive(Debug, Default)]
pub struct Samples {
    pub total: u64,
    pub states: HashMap<String, u64>,
    pub stacks: HashMap<Vec<String>, u64>,
}

impl Samples {
    /// Markdown: the states' shares, then the `top` most frequent blocked stacks.
    pub fn render(&self, top: usize) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if self.total == 0 {
            return "  no samples\n".into();
        }
        let mut states: Vec<_> = self.states.iter().collect();
        states.sort_by(|a, b| b.1.cmp(a.1));
        let shares: Vec<String> = states
            .iter()
            .map(|(k, v)| format!("{k} {:.1} %", **v as f64 * 100.0 / self.total as f64))
            .collect();
        let _ = writeln!(s, "  - {} samples: {}", self.total, shares.join(", "));
        let mut stacks: Vec<_> = self.stacks.iter().collect();
        stacks.sort_by(|a, b| b.1.cmp(a.1));
        for (frames, n) in stacks.into_iter().take(top) {
            let _ = writeln!(
                s,
                "  - {:.1} %: {}",
                *n as f64 * 100.0 / self.total as f64,
                frames.join(" < ")
            );
        }
        s
    }
}

/// A thread sampling other threads until [`Sampler::finish`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Samples>,
}

/// Frames kept per blocked stack (the call's program counter first), after a run of frames in
/// one library other than the benchmark is cut to its first (where in the driver it waits).
const FRAMES: usize = 8;
/// Bytes read above the stack pointer.
const SCAN: usize = 4096;

impl Sampler {
    /// Samples threads `tids` every `period`.
    pub fn start(tids: Vec<i32>, period: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("peers-sampler".into())
            .spawn(move || sample(&tids, period, &flag))
            .expect("a sampler thread");
        Sampler { stop, handle }
    }

    /// Stops sampling; what it saw.
    pub fn finish(self) -> Samples {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

fn sample(tids: &[i32], period: Duration, stop: &AtomicBool) -> Samples {
    let mappings = executable_mappings();
    let mut out = Samples::default();
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut words = vec![0usize; SCAN / std::mem::size_of::<usize>()];
    let names: Vec<String> = tids
        .iter()
        .map(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        for (&tid, name) in tids.iter().zip(&names) {
            let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
                continue;
            };
            let text = text.trim();
            out.total += 1;
            if text == "running" {
                *out.states.entry(format!("{name}: running")).or_default() += 1;
                continue;
            }
            let f: Vec<&str> = text.split_whitespace().collect();
            let nr: i64 = f.first().and_then(|x| x.parse().ok()).unwrap_or(-2);
            let hex = |s: &str| usize::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0);
            let args: Vec<u64> = f.iter().skip(1).take(6).map(|x| hex(x) as u64).collect();
            let (sp, pc) = match f.len() {
                9 => (hex(f[7]), hex(f[8])),
                3 => (hex(f[1]), hex(f[2])),
                _ => (0, 0),
            };
            let state = format!("{name}: {}", syscall_name(nr, &args));
            *out.states.entry(state.clone()).or_default() += 1;
            let mut frames = vec![state];
            if let Some(n) = name_of(&mappings, pc) {
                frames.push(n);
            }
            if sp != 0 {
                let local = libc::iovec {
                    iov_base: words.as_mut_ptr().cast(),
                    iov_len: SCAN,
                };
                // Four pieces: a read that meets the stack's end keeps the pieces before it.
                let remote: Vec<libc::iovec> = (0..4)
                    .map(|i| libc::iovec {
                        iov_base: (sp + i * SCAN / 4) as *mut libc::c_void,
                        iov_len: SCAN / 4,
                    })
                    .collect();
                // SAFETY: valid iovecs; the kernel checks the remote ranges (a short or failed
                // read leaves words unread, counted by `got`).
                let got = unsafe { libc::process_vm_readv(pid, &local, 1, remote.as_ptr(), 4, 0) };
                let got = if got > 0 { got as usize / 8 } else { 0 };
                for &w in &words[..got] {
                    if frames.len() > FRAMES {
                        break;
                    }
                    let Some(n) = name_of(&mappings, w) else {
                        continue;
                    };
                    let library = |f: &str| f.split('+').next().map(str::to_owned);
                    let last = frames.last().and_then(|f| library(f));
                    if !n.starts_with("peers+") && last == library(&n) {
                        continue;
                    }
                    frames.push(n);
                }
            }
            *out.stacks.entry(frames).or_default() += 1;
        }
        std::thread::sleep(period);
    }
    out
}
