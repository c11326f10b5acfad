//! A torture run as text: its settings and each thread's operations, generated from a seed or read
//! back from a log (replay, shrinking, regression tests).
//!
//! ```text
//! # torture script
//! seed 7
//! faults off
//! cleanup reaper
//! poller default
//! t0 retain d0 c1
//! t0 stream c1 s2
//! t1 work closure s2
//! ```

use std::fmt;
use std::str::FromStr;

/// Context slots (crate `PrimaryContext`s), stream slots and devices the operations name.
pub const CONTEXT_SLOTS: u8 = 4;
/// See [`CONTEXT_SLOTS`].
pub const STREAM_SLOTS: u8 = 8;
/// See [`CONTEXT_SLOTS`]; the fake is started with this many devices.
pub const DEVICES: u8 = 2;

/// The driver calls an injected fault may hit (those the crate makes).
pub const FAULT_CALLS: &[&str] = &[
    "cuLaunchHostFunc",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventCreate",
    "cuStreamGetCaptureInfo",
    "cuStreamGetId",
    "cuStreamGetCtx",
    "cuCtxGetId",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxGetState",
    "cuUserObjectCreate",
    "cuGraphRetainUserObject",
    "cuStreamWriteValue64",
    "cuMemHostRegister",
    "cuStreamCreate",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphAddHostNode",
];

/// What a piece of stream work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// `launch_host_function` with a C function and owners.
    Raw,
    /// `launch_host_function_with_bytes`.
    Bytes,
    /// `host_launch` with a closure.
    Closure,
    /// `LaunchOptions::host_launch_repeatable` (a graph node on a capturing stream).
    Repeatable,
    /// `host_launch_async`, its future watched.
    Async,
    /// `release_after`.
    ReleaseAfter,
    /// `spawn_after`.
    SpawnAfter,
    /// `CompletionMode::Auto`.
    Auto,
    /// `CompletionMode::HostFunction`.
    HostFunction,
    /// `CompletionMode::LowLatency`.
    LowLatency,
    /// `CompletionMode::Event`.
    Event,
}

const WORK_KINDS: &[(WorkKind, &str)] = &[
    (WorkKind::Raw, "raw"),
    (WorkKind::Bytes, "bytes"),
    (WorkKind::Closure, "closure"),
    (WorkKind::Repeatable, "repeatable"),
    (WorkKind::Async, "async"),
    (WorkKind::ReleaseAfter, "release"),
    (WorkKind::SpawnAfter, "spawn"),
    (WorkKind::Auto, "auto"),
    (WorkKind::HostFunction, "hostfn"),
    (WorkKind::LowLatency, "lowlat"),
    (WorkKind::Event, "event"),
];

/// A default stream, named through the calling thread's current context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// `CU_STREAM_LEGACY`.
    Legacy,
    /// `CU_STREAM_PER_THREAD`.
    PerThread,
    /// The null stream (legacy, as the driver is loaded).
    Null,
}

/// One operation of one thread. Fields name slots (`ctx`, `stream`: indices below
/// [`CONTEXT_SLOTS`], [`STREAM_SLOTS`]; an empty slot makes the operation do nothing) or devices.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `PrimaryContext::retain(device)` into a context slot (replacing what was there).
    Retain { device: u8, ctx: u8 },
    /// Drops a context slot's `PrimaryContext` (maybe the last retain).
    Release { ctx: u8 },
    /// `Stream::new` (or non-blocking) of a context slot's context into a stream slot.
    NewStream {
        ctx: u8,
        stream: u8,
        non_blocking: bool,
    },
    /// Drops or destroys what a stream slot holds (a raw `cuStreamDestroy` for foreign and created
    /// streams, with work pending; a created stream's context is destroyed too, then
    /// `reclaim_pending`).
    DropStream { stream: u8 },
    /// As another binding would: `cuDevicePrimaryCtxRetain`, kept by the world.
    ForeignRetain { device: u8 },
    /// As another binding would: `cuDevicePrimaryCtxRelease` of a foreign retain.
    ForeignRelease { device: u8 },
    /// As another binding would: `cuDevicePrimaryCtxReset`, with every stream of the device gone
    /// first (the driver's contract).
    ForeignReset { device: u8 },
    /// A raw stream of the device's primary context (with a foreign retain of its own) into a
    /// stream slot: another binding's stream.
    ForeignStream { device: u8, stream: u8 },
    /// `cuCtxCreate` and a raw stream of that context into a stream slot.
    CreatedStream { device: u8, stream: u8 },
    /// Work on a stream slot's stream.
    Work { kind: WorkKind, stream: u8 },
    /// Work on a default stream of a context slot's context (made current first).
    Special {
        kind: WorkKind,
        which: Special,
        ctx: u8,
    },
    /// A graph with a host node (`add_host_node`), instantiated, launched `replays` times on a
    /// stream slot's stream, then destroyed with its launches pending.
    Graph { stream: u8, replays: u8 },
    /// The stream's `synchronize` (or `cuStreamSynchronize`).
    Sync { stream: u8 },
    /// `flush` with a timeout.
    Flush,
    /// `drain`.
    Drain,
    /// A stand-in for a long kernel: the fake holds the stream.
    Hold { stream: u8 },
    /// Releases the oldest hold.
    Unhold,
    /// Begins a capture of the stream (`mode`: 0 global, 1 thread-local, 2 relaxed).
    BeginCapture { stream: u8, mode: u8 },
    /// Ends this thread's oldest capture (or, for relaxed ones, anyone's); the graph is replayed
    /// `replays` times, then destroyed.
    EndCapture { replays: u8 },
    /// A sticky error in the stream's context (a kernel trapped).
    Poison { stream: u8 },
    /// The `nth` next call of `FAULT_CALLS[call]` fails with `CUDA_ERROR_OUT_OF_MEMORY`.
    Fault { call: u8, nth: u8 },
    /// Makes the next capture query of a capturing stream answer "not capturing" (another thread
    /// begins a capture just after the code under test looked).
    HideCapture,
    /// Polls this thread's futures that were woken.
    Poll,
    /// Sleeps.
    Pause { micros: u16 },
    /// The process exits here (in exit runs only; elsewhere a no-op).
    Exit,
}

/// What a start hook of the crate's threads (`ThreadSettings::on_start`) does in a run: user code
/// that must never stall the thread it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAntics {
    /// No hook.
    Off,
    /// Blocks for a while.
    Blocks,
    /// Calls `flush`, which must refuse at once (`FlushOnCrateThread`).
    Flushes,
    /// Waits for a completion: on the watcher it must refuse at once (`WaitOnWatcher`), on the
    /// reaper it must resolve.
    Waits,
    /// Panics (reported as a start hook's panic).
    Panics,
    /// Panics with a payload whose own `Drop` panics.
    PanicsTwice,
}

const HOOK_ANTICS: &[(HookAntics, &str)] = &[
    (HookAntics::Off, "off"),
    (HookAntics::Blocks, "blocks"),
    (HookAntics::Flushes, "flushes"),
    (HookAntics::Waits, "waits"),
    (HookAntics::Panics, "panics"),
    (HookAntics::PanicsTwice, "panics-twice"),
];

/// The name of `value` in a table of names (`?` if it has none).
fn name_in<T: PartialEq>(table: &[(T, &'static str)], value: &T) -> &'static str {
    table
        .iter()
        .find(|(v, _)| v == value)
        .map_or("?", |(_, name)| name)
}

/// The value named `text` in a table of names; `what` names the table in the error.
fn parse_in<T: Copy>(table: &[(T, &str)], text: &str, what: &str) -> Result<T, String> {
    table
        .iter()
        .find(|(_, name)| *name == text)
        .map(|(v, _)| *v)
        .ok_or_else(|| format!("unknown {what} {text:?}"))
}

impl fmt::Display for HookAntics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(name_in(HOOK_ANTICS, self))
    }
}

impl FromStr for HookAntics {
    type Err = String;
    fn from_str(text: &str) -> Result<HookAntics, String> {
        parse_in(HOOK_ANTICS, text, "hook antics")
    }
}

/// How the process is set up for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The seed the operations came from (0 for a hand-written script).
    pub seed: u64,
    /// Whether faults are injected: the run then checks safety only (nothing early, twice or on a
    /// driver thread), not that everything is released in the end (a failed release of a retain
    /// keeps a context alive for good).
    pub faults: bool,
    /// `CleanupMode::Manual` instead of the reaper.
    pub manual_cleanup: bool,
    /// The event poller spins while anything waits (`PollerSettings::LOW_LATENCY`).
    pub spinning_poller: bool,
    /// The run ends with a thread calling `exit` while the others work.
    pub exit: bool,
    /// What the crate threads' start hook does. A run with a hook also names the threads through
    /// a function that calls into the crate (`oracle::name_acts`).
    pub hooks: HookAntics,
}

/// A whole run: settings and each thread's operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// How the process is set up.
    pub settings: Settings,
    /// Each thread's operations, in order.
    pub threads: Vec<Vec<Op>>,
}

/// A small deterministic generator (SplitMix64): the same seed gives the same script everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `true` with probability `percent` %.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn slot(&mut self, n: u8) -> u8 {
        self.below(u64::from(n)) as u8
    }
}

/// How big a generated run is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// The most threads (at least 2 are used).
    pub max_threads: usize,
    /// The most operations per thread.
    pub max_ops: usize,
}

impl Size {
    /// What `cargo test` runs per seed: a fraction of a second on the fake.
    pub const SHORT: Size = Size {
        max_threads: 8,
        max_ops: 60,
    };
    /// What the longer runs (CI under AddressSanitizer, the ten-minute search) use.
    pub const LONG: Size = Size {
        max_threads: 16,
        max_ops: 200,
    };
}

/// The start hook of `seed`'s run: drawn apart from the operations (so that the scripts of seeds
/// made before hooks were drawn stay the same): none in 70 % of runs.
fn hook_antics(seed: u64) -> HookAntics {
    let mut rng = Rng::new(seed ^ 0x686F_6F6B_735F_7631);
    if !rng.percent(30) {
        return HookAntics::Off;
    }
    HOOK_ANTICS[1 + rng.below(HOOK_ANTICS.len() as u64 - 1) as usize].0
}

/// The script of `seed`: 2 to `size.max_threads` threads; settings drawn from the seed too.
pub fn generate(seed: u64, size: Size, exit: bool) -> Script {
    let mut rng = Rng::new(seed);
    let settings = Settings {
        seed,
        faults: rng.percent(20),
        manual_cleanup: rng.percent(15),
        spinning_poller: rng.percent(25),
        exit,
        hooks: hook_antics(seed),
    };
    let threads = 2 + rng.below(size.max_threads.saturating_sub(1) as u64) as usize;
    let threads = (0..threads)
        .map(|_| {
            let ops = 10 + rng.below(size.max_ops.saturating_sub(9) as u64) as usize;
            (0..ops)
                .map(|_| generate_op(&mut rng, &settings))
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    let mut script = Script { settings, threads };
    if exit {
        // The first thread exits somewhere in its second half.
        let ops = &mut script.threads[0];
        let at = ops.len() / 2 + rng.below(ops.len() as u64 / 2 + 1) as usize;
        ops.insert(at.min(ops.len()), Op::Exit);
    }
    script
}

fn work_kind(rng: &mut Rng) -> WorkKind {
    WORK_KINDS[rng.below(WORK_KINDS.len() as u64) as usize].0
}

fn generate_op(rng: &mut Rng, settings: &Settings) -> Op {
    let device = rng.slot(DEVICES);
    let ctx = rng.slot(CONTEXT_SLOTS);
    let stream = rng.slot(STREAM_SLOTS);
    match rng.below(1000) {
        0..=379 => Op::Work {
            kind: work_kind(rng),
            stream,
        },
        380..=429 => Op::Special {
            kind: work_kind(rng),
            which: match rng.below(3) {
                0 => Special::Legacy,
                1 => Special::PerThread,
                _ => Special::Null,
            },
            ctx,
        },
        430..=489 => Op::Retain { device, ctx },
        490..=539 => Op::Release { ctx },
        540..=599 => Op::NewStream {
            ctx,
            stream,
            non_blocking: rng.percent(50),
        },
        600..=639 => Op::DropStream { stream },
        640..=659 => Op::ForeignRetain { device },
        660..=679 => Op::ForeignRelease { device },
        680..=684 => Op::ForeignReset { device },
        685..=704 => Op::ForeignStream { device, stream },
        705..=719 => Op::CreatedStream { device, stream },
        720..=744 => Op::Graph {
            stream,
            replays: rng.below(3) as u8,
        },
        745..=779 => Op::Sync { stream },
        780..=799 => Op::Flush,
        800..=814 => Op::Drain,
        815..=849 => Op::Hold { stream },
        850..=879 => Op::Unhold,
        880..=904 => Op::BeginCapture {
            stream,
            mode: rng.below(3) as u8,
        },
        905..=929 => Op::EndCapture {
            replays: rng.below(3) as u8,
        },
        930..=932 => Op::Poison { stream },
        933..=937 => Op::Release { ctx },
        938..=949 if settings.faults => Op::Fault {
            call: rng.below(FAULT_CALLS.len() as u64) as u8,
            nth: 1 + rng.below(4) as u8,
        },
        950..=957 => Op::HideCapture,
        958..=989 => Op::Poll,
        _ => Op::Pause {
            micros: rng.below(300) as u16,
        },
    }
}

impl fmt::Display for WorkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(name_in(WORK_KINDS, self))
    }
}

impl FromStr for WorkKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_in(WORK_KINDS, s, "work kind")
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Retain { device, ctx } => write!(f, "retain d{device} c{ctx}"),
            Op::Release { ctx } => write!(f, "release c{ctx}"),
            Op::NewStream {
                ctx,
                stream,
                non_blocking,
            } => write!(
                f,
                "stream c{ctx} s{stream}{}",
                if non_blocking { " nb" } else { "" }
            ),
            Op::DropStream { stream } => write!(f, "dropstream s{stream}"),
            Op::ForeignRetain { device } => write!(f, "fretain d{device}"),
            Op::ForeignRelease { device } => write!(f, "frelease d{device}"),
            Op::ForeignReset { device } => write!(f, "freset d{device}"),
            Op::ForeignStream { device, stream } => write!(f, "fstream d{device} s{stream}"),
            Op::CreatedStream { device, stream } => write!(f, "cstream d{device} s{stream}"),
            Op::Work { kind, stream } => write!(f, "work {kind} s{stream}"),
            Op::Special { kind, which, ctx } => {
                let which = match which {
                    Special::Legacy => "legacy",
                    Special::PerThread => "perthread",
                    Special::Null => "null",
                };
                write!(f, "special {kind} {which} c{ctx}")
            }
            Op::Graph { stream, replays } => write!(f, "graph s{stream} x{replays}"),
            Op::Sync { stream } => write!(f, "sync s{stream}"),
            Op::Flush => f.write_str("flush"),
            Op::Drain => f.write_str("drain"),
            Op::Hold { stream } => write!(f, "hold s{stream}"),
            Op::Unhold => f.write_str("unhold"),
            Op::BeginCapture { stream, mode } => write!(f, "begin s{stream} m{mode}"),
            Op::EndCapture { replays } => write!(f, "end x{replays}"),
            Op::Poison { stream } => write!(f, "poison s{stream}"),
            Op::Fault { call, nth } => {
                let name = FAULT_CALLS.get(usize::from(call)).copied().unwrap_or("?");
                write!(f, "fault {name} n{nth}")
            }
            Op::HideCapture => f.write_str("hidecapture"),
            Op::Poll => f.write_str("poll"),
            Op::Pause { micros } => write!(f, "pause u{micros}"),
            Op::Exit => f.write_str("exit"),
        }
    }
}

/// A number after a one-letter prefix (`s3`, `d0`).
fn number(word: Option<&str>, prefix: char) -> Result<u8, String> {
    let word = word.ok_or_else(|| format!("missing {prefix}<n>"))?;
    word.strip_prefix(prefix)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("expected {prefix}<n>, found {word:?}"))
}

impl FromStr for Op {
    type Err = String;
    fn from_str(line: &str) -> Result<Op, String> {
        let mut words = line.split_whitespace();
        let name = words.next().ok_or("empty operation")?;
        let mut next = || words.next();
        let op = match name {
            "retain" => Op::Retain {
                device: number(next(), 'd')?,
                ctx: number(next(), 'c')?,
            },
            "release" => Op::Release {
                ctx: number(next(), 'c')?,
            },
            "stream" => Op::NewStream {
                ctx: number(next(), 'c')?,
                stream: number(next(), 's')?,
                non_blocking: next() == Some("nb"),
            },
            "dropstream" => Op::DropStream {
                stream: number(next(), 's')?,
            },
            "fretain" => Op::ForeignRetain {
                device: number(next(), 'd')?,
            },
            "frelease" => Op::ForeignRelease {
                device: number(next(), 'd')?,
            },
            "freset" => Op::ForeignReset {
                device: number(next(), 'd')?,
            },
            "fstream" => Op::ForeignStream {
                device: number(next(), 'd')?,
                stream: number(next(), 's')?,
            },
            "cstream" => Op::CreatedStream {
                device: number(next(), 'd')?,
                stream: number(next(), 's')?,
            },
            "work" => Op::Work {
                kind: next().ok_or("missing work kind")?.parse()?,
                stream: number(next(), 's')?,
            },
            "special" => {
                let kind = next().ok_or("missing work kind")?.parse()?;
                let which = match next() {
                    Some("legacy") => Special::Legacy,
                    Some("perthread") => Special::PerThread,
                    Some("null") => Special::Null,
                    other => return Err(format!("unknown default stream {other:?}")),
                };
                Op::Special {
                    kind,
                    which,
                    ctx: number(next(), 'c')?,
                }
            }
            "graph" => Op::Graph {
                stream: number(next(), 's')?,
                replays: number(next(), 'x')?,
            },
            "sync" => Op::Sync {
                stream: number(next(), 's')?,
            },
            "flush" => Op::Flush,
            "drain" => Op::Drain,
            "hold" => Op::Hold {
                stream: number(next(), 's')?,
            },
            "unhold" => Op::Unhold,
            "begin" => Op::BeginCapture {
                stream: number(next(), 's')?,
                mode: number(next(), 'm')?,
            },
            "end" => Op::EndCapture {
                replays: number(next(), 'x')?,
            },
            "poison" => Op::Poison {
                stream: number(next(), 's')?,
            },
            "fault" => {
                let call = next().ok_or("missing call")?;
                let call = FAULT_CALLS
                    .iter()
                    .position(|c| *c == call)
                    .ok_or_else(|| format!("unknown fault call {call:?}"))?;
                Op::Fault {
                    call: call as u8,
                    nth: number(next(), 'n')?,
                }
            }
            "hidecapture" => Op::HideCapture,
            "poll" => Op::Poll,
            "pause" => Op::Pause {
                micros: next()
                    .and_then(|w| w.strip_prefix('u'))
                    .and_then(|n| n.parse().ok())
                    .ok_or("expected u<micros>")?,
            },
            "exit" => Op::Exit,
            other => return Err(format!("unknown operation {other:?}")),
        };
        Ok(op)
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        let on = |b: bool| if b { "on" } else { "off" };
        writeln!(f, "# torture script")?;
        writeln!(f, "seed {}", s.seed)?;
        writeln!(f, "faults {}", on(s.faults))?;
        writeln!(
            f,
            "cleanup {}",
            if s.manual_cleanup { "manual" } else { "reaper" }
        )?;
        writeln!(
            f,
            "poller {}",
            if s.spinning_poller {
                "spinning"
            } else {
                "default"
            }
        )?;
        writeln!(f, "exit {}", on(s.exit))?;
        writeln!(f, "hooks {}", s.hooks)?;
        for (t, ops) in self.threads.iter().enumerate() {
            for op in ops {
                writeln!(f, "t{t} {op}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Script {
    type Err = String;
    fn from_str(text: &str) -> Result<Script, String> {
        let mut settings = Settings {
            seed: 0,
            faults: false,
            manual_cleanup: false,
            spinning_poller: false,
            exit: false,
            hooks: HookAntics::Off,
        };
        let mut threads: Vec<Vec<Op>> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fail = |e: String| format!("line {}: {e}: {line:?}", n + 1);
            let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
            match head {
                "seed" => {
                    settings.seed = rest.trim().parse().map_err(|_| fail("bad seed".into()))?
                }
                "faults" => settings.faults = rest.trim() == "on",
                "cleanup" => settings.manual_cleanup = rest.trim() == "manual",
                "poller" => settings.spinning_poller = rest.trim() == "spinning",
                "exit" => settings.exit = rest.trim() == "on",
                "hooks" => settings.hooks = rest.trim().parse().map_err(fail)?,
                thread if thread.starts_with('t') => {
                    let t: usize = thread[1..].parse().map_err(|_| fail("bad thread".into()))?;
                    if threads.len() <= t {
                        threads.resize_with(t + 1, Vec::new);
                    }
                    threads[t].push(rest.parse().map_err(fail)?);
                }
                _ => return Err(fail("unknown line".into())),
            }
        }
        Ok(Script { settings, threads })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_script_reads_back_as_written() {
        for seed in 0..50 {
            let script = generate(seed, Size::LONG, seed % 3 == 0);
            let text = script.to_string();
            let back: Script = text.parse().unwrap();
            assert_eq!(back, script, "seed {seed}:\n{text}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_script() {
        assert_eq!(
            generate(9, Size::SHORT, false),
            generate(9, Size::SHORT, false)
        );
        assert_ne!(
            generate(9, Size::SHORT, false),
            generate(10, Size::SHORT, false)
        );
    }
}
