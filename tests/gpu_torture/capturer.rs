//! The capturing thread of the GPU torture run: what a framework does beside the crate's users.
//! Over and over it captures a raw stream of its own (`cuStreamBeginCapture`, in global,
//! thread-local and relaxed mode, from a thread in the default or the relaxed interaction mode),
//! puts a kernel and some of the crate's launches into the capture, keeps it open for a few
//! milliseconds while the workers and the crate's threads go on, and ends it. The end must succeed:
//! nothing the crate's threads do may invalidate another thread's capture. Run-once launches on
//! the capturing stream must be refused, repeatable ones become nodes of the graph, which is then
//! launched and destroyed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUstream, CUstreamCaptureMode};
use cuda_host_launch::{CompletionMode, Error, Graph, RawStream};

use crate::Rng;
use crate::oracle::{Antics, Kind, Tracked, run};
use crate::worker::enqueue;

const MODES: [CUstreamCaptureMode; 3] = [
    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
];

fn mode_name(mode: CUstreamCaptureMode) -> &'static str {
    match mode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL => "global",
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL => "thread-local",
        _ => "relaxed",
    }
}

/// Sets the calling thread's capture-interaction mode.
pub fn set_interaction_mode(mode: CUstreamCaptureMode) {
    let mut mode = mode;
    // SAFETY: a valid in/out mode; it concerns the calling thread only.
    unsafe { run().driver.cuThreadExchangeStreamCaptureMode(&mut mode) }
        .unwrap_or_else(|e| panic!("cuThreadExchangeStreamCaptureMode: {e}"));
}

/// Captures until `until` (or a violation); returns what is not settled yet.
pub fn capture_until(seed: u64, until: Instant) -> Vec<Arc<Tracked>> {
    let run = run();
    run.bind_thread();
    let name: Arc<str> = "capturer".into();
    let log = run.new_log(&name);
    let mut rng = Rng::new(seed);
    let mut raw: CUstream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is current. 1: CU_STREAM_NON_BLOCKING.
    unsafe { run.driver.cuStreamCreate(&mut raw, 1) }
        .unwrap_or_else(|e| panic!("cuStreamCreate: {e}"));
    // SAFETY: destroyed at the end, after its last use.
    let stream = unsafe { RawStream::from_raw(raw) };
    let label: Arc<str> = "capture stream (raw)".into();
    let slot = run.fresh_slot(true).expect("a slot for the capture stream");
    let mut tracked = Vec::new();
    let mut number = 0u32;
    while Instant::now() < until && !run.failed() {
        let mode = MODES[rng.below(3) as usize];
        let relaxed_thread = rng.percent(50);
        set_interaction_mode(if relaxed_thread {
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
        } else {
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL
        });
        let setting = format!(
            "a {} capture (the capturing thread in {} interaction mode)",
            mode_name(mode),
            if relaxed_thread { "relaxed" } else { "default" }
        );
        // SAFETY: a live stream of this thread; a valid mode.
        if let Err(e) = unsafe { run.driver.cuStreamBeginCapture_v2(raw, mode) } {
            run.violation(format!("capturer: {setting} did not begin: {e}"));
            break;
        }
        number += 1;
        let mut inside = vec![format!("position {number}")];
        if let Err(e) = run.write_position(raw, slot, number, rng.below(20_000)) {
            run.violation(format!(
                "capturer: the position written into {setting} failed (its capture \
                 invalidated?): {e}"
            ));
        }
        let mut nodes = Vec::new();
        for _ in 0..rng.below(4) {
            let repeatable = rng.percent(50);
            let kind = if repeatable {
                Kind::CapturedRepeatable
            } else {
                match rng.below(9) {
                    0 => Kind::Closure,
                    1 => Kind::Raw,
                    2 => Kind::Async,
                    3 => Kind::ReleaseAfter,
                    4 => Kind::SpawnAfter,
                    5 => Kind::Completion(CompletionMode::Auto),
                    6 => Kind::Completion(CompletionMode::HostFunction),
                    7 => Kind::Completion(CompletionMode::LowLatency),
                    _ => Kind::Completion(CompletionMode::Event),
                }
            };
            let t = Tracked::new(&name, kind, &label, slot, number);
            inside.push(format!("#{} {}", t.id, kind.name()));
            let binds = rng.percent(20);
            let antics = Antics::pick_for(kind, &mut rng);
            let result = enqueue(&t, kind, &stream, binds, antics);
            match (repeatable, result) {
                (true, Ok(_)) => {
                    t.returned(true);
                    nodes.push(Arc::clone(&t));
                }
                (true, Err(e)) => {
                    t.returned(false);
                    run.violation(format!(
                        "{}: refused on a capturing stream in {setting}: {e}",
                        t.describe()
                    ));
                }
                (false, Err(Error::CaptureActive { .. } | Error::ReleaseDuringCapture { .. })) => {
                    t.returned(false);
                    run.stats.add("refused on a capturing stream");
                }
                (false, Err(e)) => {
                    t.returned(false);
                    run.violation(format!(
                        "{}: refused on a capturing stream in {setting} with an unexpected \
                         error: {e}",
                        t.describe()
                    ));
                }
                (false, Ok(future)) => {
                    t.returned(true);
                    t.resolved.store(true, Ordering::Release);
                    drop(future);
                    run.violation(format!(
                        "{}: a run-once operation was accepted on a capturing stream in {setting}",
                        t.describe()
                    ));
                }
            }
            tracked.push(t);
        }
        // The capture stays open a while: the workers, the reaper and the pollers go on meanwhile.
        let open = Duration::from_micros(rng.below(4_000));
        inside.push(format!("open for {open:?}"));
        log.note(format!("{setting}: {}", inside.join(", ")));
        std::thread::sleep(open);
        // An invalidated capture's end destroys its graph (and lets go of its nodes' owners)
        // inside the call: gone from here, unless the end succeeds.
        for t in &nodes {
            t.graph_gone.store(true, Ordering::Release);
        }
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream this thread began capturing; a valid out-pointer.
        let ended = unsafe { run.driver.cuStreamEndCapture(raw, &mut graph) };
        set_interaction_mode(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        if let Err(e) = ended {
            run.violation(format!(
                "capturer: {setting} was invalidated ({e}). Inside it: {}",
                inside.join(", ")
            ));
            for t in &nodes {
                t.expected_runs.store(0, Ordering::Release);
            }
            continue;
        }
        run.stats.add("capture ended valid");
        for t in &nodes {
            t.graph_gone.store(false, Ordering::Release);
        }
        // SAFETY: the graph the capture made, owned by nobody else.
        let graph = unsafe { Graph::from_raw(graph) };
        let launches = rng.below(4) as u32;
        let mut replayed = 0;
        match graph.instantiate() {
            Ok(exec) => {
                for _ in 0..launches {
                    match exec.launch(stream) {
                        Ok(()) => replayed += 1,
                        Err(e) => run.violation(format!("capturer: a graph launch failed: {e}")),
                    }
                }
                for t in &nodes {
                    t.expected_runs.store(replayed, Ordering::Release);
                }
                log.note(format!("graph {number}: {replayed} launches"));
                if let Err(e) = run.wait_idle(raw) {
                    run.violation(format!("capturer: after graph {number}'s launches, {e}"));
                }
                for t in &nodes {
                    t.graph_gone.store(true, Ordering::Release);
                }
                drop(exec);
            }
            Err(e) => {
                run.violation(format!("capturer: graph {number} did not instantiate: {e}"));
                for t in &nodes {
                    t.expected_runs.store(0, Ordering::Release);
                    t.graph_gone.store(true, Ordering::Release);
                }
            }
        }
        drop(graph);
    }
    set_interaction_mode(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
    if let Err(e) = run.wait_idle(raw) {
        run.violation(format!("capturer: at the end, {e}"));
    }
    // SAFETY: made above, destroyed once; no capture runs on it.
    let _ = unsafe { run.driver.cuStreamDestroy_v2(raw) };
    tracked.retain(|t| !t.settled());
    tracked
}
