//! Wake latency: a stream held by `cuStreamWaitValue32` on a mapped host word; each method arms
//! its completion after the wait, the host opens the word after the hold and stamps the time, and
//! the sample is the time from that stamp to the method's waker being woken (or, for a parked
//! waiter, to its `block_on` returning on the woken thread).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::cpu::{Snapshot, Used};
use crate::gpu::Hold;
use crate::wake::{
    BoxFuture, StampWaker, now_ns, park_until_ready, poll_with, thread_waker, wait_until,
};

/// How long a sample may wait for its wake past the hold before the row fails.
const WAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Arms a method's completion on the held stream.
pub type Arm = Box<dyn Fn() -> Result<BoxFuture, String> + Send + Sync>;

/// One way to learn of the completion.
pub struct Method {
    pub name: String,
    /// The library, for the ratio column ("ours", "cuda-async", "raw").
    pub library: &'static str,
    /// The library's threads, by `comm` prefix, for the CPU column.
    pub threads: &'static [&'static str],
    /// Awaited by a `block_on` that parks a thread of its own (else: the measuring thread polls
    /// once with a waker that stamps the time, and spins until it is stamped).
    pub parked: bool,
    /// Runs at these holds only (`None`: every hold).
    pub holds: Option<Vec<Duration>>,
    /// Called on a parked waiter's thread before its first poll (binds a context there).
    pub waiter_setup: Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>,
    pub arm: Arm,
}

/// One method's samples at one hold.
pub struct Row {
    pub method: usize,
    pub hold: Duration,
    /// Open → woken, µs, every sample.
    pub samples: Vec<f64>,
    /// The p50 of each repetition, µs.
    pub rep_p50: Vec<f64>,
    pub cpu: Used,
    pub error: Option<String>,
}

/// A parked waiter's thread: takes futures, reports when each is armed and when it resolved.
struct Waiter {
    futures: Sender<BoxFuture>,
    events: Receiver<Result<u64, String>>,
}

impl Waiter {
    fn start(setup: Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>) -> Waiter {
        let (futures, inbox) = channel::<BoxFuture>();
        let (outbox, events) = channel();
        std::thread::Builder::new()
            .name("peers-parked".into())
            .spawn(move || {
                if let Some(setup) = setup
                    && let Err(e) = setup()
                {
                    let _ = outbox.send(Err(e));
                    return;
                }
                let waker = thread_waker();
                while let Ok(mut future) = inbox.recv() {
                    if let Poll::Ready(result) = poll_with(&mut future, &waker) {
                        let _ = outbox
                            .send(Err(format!("resolved before the hold opened ({result:?})")));
                        continue;
                    }
                    let _ = outbox.send(Ok(0)); // armed
                    let done =
                        park_until_ready(&mut future, &waker, WAKE_TIMEOUT).map(|()| now_ns());
                    let _ = outbox.send(done);
                }
            })
            .expect("spawn the parked waiter");
        Waiter { futures, events }
    }
}

fn sample(
    method: &Method,
    hold: Duration,
    held: &mut Hold,
    stream: cuda_dl_sys::types::CUstream,
    waiter: Option<&Waiter>,
) -> Result<f64, String> {
    held.close(stream)?;
    let armed = (method.arm)();
    let mut future = match armed {
        Ok(future) => future,
        Err(e) => {
            held.open();
            return Err(e);
        }
    };
    if let Some(waiter) = waiter {
        waiter
            .futures
            .send(future)
            .map_err(|_| "the parked waiter stopped")?;
        if let Err(e) = waiter
            .events
            .recv()
            .map_err(|_| "the parked waiter stopped".to_string())?
        {
            held.open();
            return Err(e);
        }
        wait_until(Instant::now() + hold);
        let opened = now_ns();
        held.open();
        let done = waiter
            .events
            .recv()
            .map_err(|_| "the parked waiter stopped".to_string())??;
        return Ok(done.saturating_sub(opened) as f64 / 1000.0);
    }
    let stamp = Arc::new(StampWaker {
        stamp: Default::default(),
    });
    let waker = Waker::from(Arc::clone(&stamp));
    if let Poll::Ready(result) = poll_with(&mut future, &waker) {
        held.open();
        return Err(format!("resolved before the hold opened ({result:?})"));
    }
    wait_until(Instant::now() + hold);
    let opened = now_ns();
    held.open();
    let deadline = Instant::now() + WAKE_TIMEOUT;
    let woken = loop {
        let woken = stamp.stamp.load(Ordering::Acquire);
        if woken != 0 {
            break woken;
        }
        if Instant::now() > deadline {
            return Err(format!("not woken within {WAKE_TIMEOUT:?} of the open"));
        }
        std::hint::spin_loop();
    };
    // The wake must mean the completion: the next poll resolves it.
    let noop = Waker::noop();
    loop {
        match poll_with(&mut future, noop) {
            Poll::Ready(result) => result?,
            Poll::Pending if Instant::now() > deadline => {
                return Err("woken, but still pending".into());
            }
            Poll::Pending => {
                std::thread::yield_now();
                continue;
            }
        }
        break;
    }
    Ok(woken.saturating_sub(opened) as f64 / 1000.0)
}

/// Every method at every hold, `knobs.reps` repetitions, the methods taking turns in rotating
/// order within each repetition and hold.
pub fn run(
    methods: &[Method],
    holds: &[Duration],
    samples_per_rep: impl Fn(Duration) -> usize,
    reps: usize,
    held: &mut Hold,
    stream: cuda_dl_sys::types::CUstream,
    sync: &dyn Fn() -> Result<(), String>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for &hold in holds {
        for (m, method) in methods.iter().enumerate() {
            if method.holds.as_ref().is_none_or(|h| h.contains(&hold)) {
                rows.push(Row {
                    method: m,
                    hold,
                    samples: Vec::new(),
                    rep_p50: Vec::new(),
                    cpu: Used::default(),
                    error: None,
                });
            }
        }
    }
    for rep in 0..reps {
        for &hold in holds {
            let here: Vec<usize> = (0..rows.len()).filter(|&r| rows[r].hold == hold).collect();
            for j in 0..here.len() {
                let row = &mut rows[here[(rep + j) % here.len()]];
                if row.error.is_some() {
                    continue;
                }
                let method = &methods[row.method];
                let waiter = method
                    .parked
                    .then(|| Waiter::start(method.waiter_setup.clone()));
                let n = samples_per_rep(hold);
                let mut these = Vec::with_capacity(n);
                let before = Snapshot::take();
                for _ in 0..n {
                    match sample(method, hold, held, stream, waiter.as_ref()) {
                        Ok(us) => these.push(us),
                        Err(e) => {
                            row.error = Some(e);
                            break;
                        }
                    }
                }
                let after = Snapshot::take();
                row.cpu += before.used_until(&after, method.threads);
                if let Err(e) = sync() {
                    row.error.get_or_insert(e);
                }
                row.rep_p50.push(crate::stats::median(&these));
                row.samples.extend(these);
            }
        }
    }
    rows
}
