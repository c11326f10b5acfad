//! Throughput: completions per second with many streams in flight at once, each item a
//! `cuStreamWriteValue32` into a mapped word and the library's completion of it; and 8 threads ×
//! 8 streams of our `spawn_after` beside raw `cuEventRecord` rings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cuda_host_launch::Stream;

use crate::cpu::{Snapshot, Used};
use crate::gpu::{Gpu, MappedWords};
use crate::waits::{Sampler, Samples, ThreadCounters, my_tid};
use crate::wake::{BoxFuture, run_all};

/// Makes the completion future of the item just enqueued on stream `i`.
pub type MakeFuture = Arc<dyn Fn(usize) -> Result<BoxFuture, String> + Send + Sync>;

/// Records one item of thread `t` on stream `s` (an index of the run's streams).
pub type Record = Arc<dyn Fn(usize, usize, &Stream) -> Result<(), String> + Send + Sync>;

/// How many threads, streams per thread and items per thread.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub threads: usize,
    pub streams_each: usize,
    pub items: usize,
}

/// One measured run.
#[derive(Debug, Clone)]
pub struct Rate {
    pub per_second: f64,
    pub cpu: Used,
    pub items: usize,
    /// The enqueuing threads' scheduler counters, summed (`threads_by_streams` only).
    pub enqueuers: Option<ThreadCounters>,
    /// What a sampler saw the enqueuing threads doing (when asked for).
    pub waits: Option<Arc<Samples>>,
}

/// `tasks_per_stream` tasks on each of `streams`, each enqueuing `items` items one after another
/// and awaiting each one's completion (made by `make`), all on one executor thread.
pub fn futures_in_flight(
    streams: &Arc<Vec<Arc<Stream>>>,
    words: &Arc<MappedWords>,
    tasks_per_stream: usize,
    items: usize,
    make: &MakeFuture,
    threads: &[&str],
) -> Result<Rate, String> {
    let mut tasks: Vec<BoxFuture> = Vec::new();
    for t in 0..tasks_per_stream {
        for i in 0..streams.len() {
            let (streams, words, make) = (Arc::clone(streams), Arc::clone(words), Arc::clone(make));
            tasks.push(Box::pin(async move {
                for k in 0..items {
                    words.write_on(streams[i].raw(), i, (t * items + k) as u32)?;
                    make(i)?.await?;
                }
                Ok(())
            }));
        }
    }
    let total = tasks_per_stream * items * streams.len();
    let before = Snapshot::take();
    let started = Instant::now();
    run_all(tasks, Duration::from_secs(120))?;
    let elapsed = started.elapsed();
    let cpu = before.used_until(&Snapshot::take(), threads);
    Ok(Rate {
        per_second: total as f64 / elapsed.as_secs_f64(),
        cpu,
        items: total,
        enqueuers: None,
        waits: None,
    })
}

/// `shape.threads` threads, each with `shape.streams_each` streams of its own, each thread
/// enqueuing `shape.items` items round robin over its streams with `record(thread, stream index, stream)`; the
/// time from the start until `all_done` returns. With `sample`, a [`Sampler`] watches the
/// enqueuing threads every 100 µs while they enqueue.
pub fn threads_by_streams(
    gpu: &Arc<Gpu>,
    streams: &Arc<Vec<Arc<Stream>>>,
    shape: Shape,
    record: Record,
    all_done: &dyn Fn(),
    library_threads: &[&str],
    sample: bool,
) -> Result<Rate, String> {
    let Shape {
        threads,
        streams_each,
        items,
    } = shape;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let errors = Arc::new(AtomicU64::new(0));
    let tids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..threads {
        let (gpu, streams, record, barrier, errors, tids) = (
            Arc::clone(gpu),
            Arc::clone(streams),
            Arc::clone(&record),
            Arc::clone(&barrier),
            Arc::clone(&errors),
            Arc::clone(&tids),
        );
        handles.push(std::thread::spawn(
            move || -> Result<ThreadCounters, String> {
                gpu.bind();
                tids.lock().map_err(|_| "tids poisoned")?.push(my_tid());
                barrier.wait();
                let before = ThreadCounters::now();
                for k in 0..items {
                    let s = t * streams_each + k % streams_each;
                    if let Err(e) = record(t, s, &streams[s]) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                Ok(before.until(&ThreadCounters::now()))
            },
        ));
    }
    let before = Snapshot::take();
    barrier.wait();
    let started = Instant::now();
    let sampler = sample.then(|| {
        let tids = tids.lock().map(|t| t.clone()).unwrap_or_default();
        Sampler::start(tids, Duration::from_micros(100))
    });
    let mut first_error = None;
    let mut enqueuers = ThreadCounters::default();
    for handle in handles {
        match handle
            .join()
            .map_err(|_| "a recording thread panicked".to_string())?
        {
            Ok(counters) => enqueuers += counters,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let waits = sampler.map(|s| Arc::new(s.finish()));
    if let Some(e) = first_error {
        return Err(e);
    }
    all_done();
    let elapsed = started.elapsed();
    let cpu = before.used_until(&Snapshot::take(), library_threads);
    Ok(Rate {
        per_second: (threads * items) as f64 / elapsed.as_secs_f64(),
        cpu,
        items: threads * items,
        enqueuers: Some(enqueuers),
        waits,
    })
}
