//! The raw driver through `cuda-dl-sys`, the floors: a thread spinning on `cuEventQuery` of an
//! event recorded after the hold, or on a mapped word the stream writes after it
//! (`cuStreamWriteValue32`, the flag transports' floor), `cuEventRecord` rings retired by one
//! polling thread, and `cuLaunchHostFunc` with a static C function.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUevent, CUresult, CUstream, CUstreamCaptureMode};

use crate::gpu::{Gpu, MappedWords};
use crate::wake::{BoxFuture, Signal};

/// The floor's spinner and the rings' poller (threads of this benchmark).
pub const THREADS: &[&str] = &["peers-floor", "peers-ring"];

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 0x2;

fn new_event(driver: &Driver) -> Result<usize, String> {
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the primary context is current on the calling thread.
    unsafe { driver.cuEventCreate(&mut event, DISABLE_TIMING) }
        .map_err(|e| format!("cuEventCreate: {e}"))?;
    Ok(event.expose_provenance())
}

/// What the spinner watches for one sample.
enum Watch {
    /// The event completes.
    Event(usize),
    /// The floor's word holds this value.
    Word(u32),
}

struct Job {
    watch: Watch,
    signal: Arc<Signal>,
}

/// The latency floors: an event recorded after the hold, or a write of a mapped word after it,
/// and a thread that spins on `cuEventQuery` of the event, or on the word, from the moment it is
/// armed until it completes, then fires the signal.
pub struct Floor {
    driver: &'static Driver,
    event: usize,
    words: Arc<MappedWords>,
    /// The value the next word write writes (never 0, the word's first value).
    next: AtomicU64,
    jobs: Mutex<Option<Sender<Job>>>,
    spinner: Mutex<Option<JoinHandle<()>>>,
}

impl Floor {
    pub fn new(gpu: &Gpu) -> Result<Floor, String> {
        let driver = gpu.driver;
        let event = new_event(driver)?;
        let words = Arc::new(MappedWords::new(gpu, 1)?);
        let (jobs, receiver) = channel::<Job>();
        let watched = Arc::clone(&words);
        let spinner = std::thread::Builder::new()
            .name("peers-floor".into())
            .spawn(move || spin(driver, &watched, receiver))
            .map_err(|e| format!("spawn: {e}"))?;
        Ok(Floor {
            driver,
            event,
            words,
            next: AtomicU64::new(1),
            jobs: Mutex::new(Some(jobs)),
            spinner: Mutex::new(Some(spinner)),
        })
    }

    /// Records the event on `stream` and hands it to the spinner.
    pub fn arm(&self, stream: CUstream) -> Result<BoxFuture, String> {
        let event = std::ptr::with_exposed_provenance_mut(self.event);
        // SAFETY: an event of the stream's context; the previous sample's record completed.
        unsafe { self.driver.cuEventRecord(event, stream) }
            .map_err(|e| format!("cuEventRecord: {e}"))?;
        self.hand_over(Watch::Event(self.event))
    }

    /// Enqueues a write of a new value into the floor's word on `stream` and hands the value to
    /// the spinner: the floor of a transport that reads host memory the stream writes.
    pub fn arm_word(&self, stream: CUstream) -> Result<BoxFuture, String> {
        // Wraps past u32::MAX back to 1, never 0.
        let value = (self.next.fetch_add(1, Ordering::Relaxed) % u64::from(u32::MAX)) as u32 + 1;
        self.words.write_on(stream, 0, value)?;
        self.hand_over(Watch::Word(value))
    }

    fn hand_over(&self, watch: Watch) -> Result<BoxFuture, String> {
        let signal = Arc::new(Signal::default());
        let job = Job {
            watch,
            signal: Arc::clone(&signal),
        };
        self.jobs
            .lock()
            .unwrap()
            .as_ref()
            .ok_or("the floor's spinner stopped")?
            .send(job)
            .map_err(|_| "the floor's spinner stopped".to_string())?;
        Ok(Signal::future(signal))
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.jobs.lock().unwrap().take();
        if let Some(spinner) = self.spinner.lock().unwrap().take() {
            let _ = spinner.join();
        }
        // SAFETY: the floor's event, no longer recorded nor queried (the spinner has exited).
        let _ = unsafe {
            self.driver
                .cuEventDestroy(std::ptr::with_exposed_provenance_mut(self.event))
        };
    }
}

fn spin(driver: &'static Driver, words: &MappedWords, jobs: Receiver<Job>) {
    let Ok(query) = driver.raw().cuEventQuery() else {
        return;
    };
    while let Ok(job) = jobs.recv() {
        match job.watch {
            Watch::Event(event) => {
                let event = std::ptr::with_exposed_provenance_mut(event);
                loop {
                    // SAFETY: a recorded event; `cuEventQuery` needs no current context.
                    let code = unsafe { query(event) };
                    if code != CUresult::CUDA_ERROR_NOT_READY {
                        // An error resolves the future too: the sample then fails on the
                        // stream's check.
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            Watch::Word(value) => {
                while words.host(0).load(Ordering::Acquire) != value {
                    std::hint::spin_loop();
                }
            }
        }
        job.signal.fire();
    }
}

extern "C" fn noop(_: *mut c_void) {}

/// Enqueues `n` no-op host functions with `cuLaunchHostFunc` and a static C function.
pub fn host_function_noops(driver: &Driver, stream: CUstream, n: usize) -> Result<(), String> {
    let launch = driver
        .raw()
        .cuLaunchHostFunc()
        .map_err(|e| format!("cuLaunchHostFunc: {e}"))?;
    for _ in 0..n {
        // SAFETY: a live stream; `noop` ignores its argument and calls no CUDA.
        let code = unsafe { launch(stream, Some(noop), std::ptr::null_mut()) };
        if code != CUresult::CUDA_SUCCESS {
            return Err(format!("cuLaunchHostFunc: {code:?}"));
        }
    }
    Ok(())
}

/// Events per lane: a slot is recorded again only once the poller saw it complete.
const RING: usize = 4096;

struct Lane {
    events: Vec<usize>,
    issued: AtomicU64,
    done: AtomicU64,
}

struct Rings {
    driver: &'static Driver,
    context: usize,
    lanes: Vec<Lane>,
    stop: AtomicBool,
}

/// `cuEventRecord` from rings of events, one ring (lane) per recording thread and stream, and one
/// polling thread that retires each lane newest first (the event transport without a library's
/// bookkeeping; as `benches/host_launch/event_lanes.rs`).
pub struct EventRings {
    rings: Arc<Rings>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

impl EventRings {
    /// `lanes` rings (the poller not started).
    pub fn new(gpu: &Gpu, lanes: usize) -> Result<EventRings, String> {
        let lanes = (0..lanes)
            .map(|_| {
                Ok(Lane {
                    events: (0..RING)
                        .map(|_| new_event(gpu.driver))
                        .collect::<Result<_, String>>()?,
                    issued: AtomicU64::new(0),
                    done: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let rings = Arc::new(Rings {
            driver: gpu.driver,
            context: gpu.context.raw().expose_provenance(),
            lanes,
            stop: AtomicBool::new(false),
        });
        Ok(EventRings {
            rings,
            poller: Mutex::new(None),
        })
    }

    /// Starts the poller.
    pub fn start(&self) -> Result<(), String> {
        self.stop();
        self.rings.stop.store(false, Ordering::SeqCst);
        let shared = Arc::clone(&self.rings);
        let poller = std::thread::Builder::new()
            .name("peers-ring".into())
            .spawn(move || poll(&shared))
            .map_err(|e| format!("spawn: {e}"))?;
        *self.poller.lock().unwrap() = Some(poller);
        Ok(())
    }

    /// Stops the poller.
    pub fn stop(&self) {
        self.rings.stop.store(true, Ordering::SeqCst);
        if let Some(poller) = self.poller.lock().unwrap().take() {
            let _ = poller.join();
        }
    }

    /// Records the next event of `lane` on `stream` (the lane's one recording thread), once its
    /// slot is free.
    pub fn record(&self, lane: usize, stream: CUstream) -> Result<(), String> {
        let l = &self.rings.lanes[lane];
        let i = l.issued.load(Ordering::Relaxed);
        while i - l.done.load(Ordering::Acquire) >= RING as u64 {
            std::hint::spin_loop();
        }
        let event = std::ptr::with_exposed_provenance_mut(l.events[i as usize % RING]);
        // SAFETY: an event of the stream's context, free (the poller saw its last record complete).
        unsafe { self.rings.driver.cuEventRecord(event, stream) }
            .map_err(|e| format!("cuEventRecord: {e}"))?;
        l.issued.store(i + 1, Ordering::Release);
        Ok(())
    }

    /// As [`EventRings::record`], with the driver calls our enqueue adds around the record: a
    /// capture query before and one after (`cuStreamGetCaptureInfo`). What the crate's enqueue
    /// costs the driver, without the crate's own bookkeeping.
    pub fn record_with_capture_queries(&self, lane: usize, stream: CUstream) -> Result<(), String> {
        capture_query(self.rings.driver, stream)?;
        self.record(lane, stream)?;
        capture_query(self.rings.driver, stream)
    }

    /// Waits until the poller saw every record complete.
    pub fn wait_all(&self) {
        for l in &self.rings.lanes {
            while l.done.load(Ordering::Acquire) < l.issued.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for EventRings {
    fn drop(&mut self) {
        self.stop();
        for lane in &self.rings.lanes {
            for &event in &lane.events {
                // SAFETY: an event of this ring, no longer recorded or queried.
                let _ = unsafe {
                    self.rings
                        .driver
                        .cuEventDestroy(std::ptr::with_exposed_provenance_mut(event))
                };
            }
        }
    }
}

/// One `cuStreamGetCaptureInfo` of `stream`, as the crate asks it.
fn capture_query(driver: &Driver, stream: CUstream) -> Result<(), String> {
    let info = driver
        .raw()
        .cuStreamGetCaptureInfo()
        .map_err(|e| format!("cuStreamGetCaptureInfo: {e}"))?;
    let mut status = cuda_dl_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let (mut id, mut graph) = (0, std::ptr::null_mut());
    // SAFETY: a valid stream; valid out-pointers for the status, id and graph; the dependency
    // outputs are optional.
    let code = unsafe {
        info(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if code != CUresult::CUDA_SUCCESS {
        return Err(format!("cuStreamGetCaptureInfo: {code:?}"));
    }
    Ok(())
}

fn poll(s: &Rings) {
    let Ok(query) = s.driver.raw().cuEventQuery() else {
        return;
    };
    // SAFETY: the run's primary context, retained for the whole run; a valid in/out mode.
    unsafe {
        let _ = s
            .driver
            .cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(s.context));
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let _ = s.driver.cuThreadExchangeStreamCaptureMode(&mut mode);
    }
    while !s.stop.load(Ordering::Relaxed) {
        for l in &s.lanes {
            let issued = l.issued.load(Ordering::Acquire);
            let done = l.done.load(Ordering::Relaxed);
            if done >= issued {
                continue;
            }
            // The newest first: its completion completes every older one of the lane (one stream).
            let event =
                std::ptr::with_exposed_provenance_mut(l.events[(issued - 1) as usize % RING]);
            // SAFETY: a recorded event of the lane.
            if unsafe { query(event) } == CUresult::CUDA_SUCCESS {
                l.done.store(issued, Ordering::Release);
                continue;
            }
            let mut done = done;
            while done < issued {
                let event = std::ptr::with_exposed_provenance_mut(l.events[done as usize % RING]);
                // SAFETY: a recorded event of the lane.
                if unsafe { query(event) } != CUresult::CUDA_SUCCESS {
                    break;
                }
                done += 1;
            }
            l.done.store(done, Ordering::Release);
        }
        std::hint::spin_loop();
    }
}
