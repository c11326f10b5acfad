//! The event transport's floor for issue 31's rows: `cuEventRecord` from rings of events, one ring
//! ("lane") per recording thread and stream, and one poller thread (pinned to a CPU of its own
//! when the benchmark pins) that retires each lane's records newest first, as the crate's poller
//! does. Nothing of the library's bookkeeping (capture queries, pools, tickets, hand-over,
//! owners): `release_after` next to this is what that bookkeeping costs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUcontext, CUevent, CUevent_flags, CUresult, CUstream, CUstreamCaptureMode,
};

/// Events per lane: a slot is recorded again only once the poller saw it complete.
const RING: usize = 4096;

struct Lane {
    events: Vec<usize>,
    /// Records made (by the lane's one recording thread).
    issued: AtomicU64,
    /// Records the poller saw complete.
    done: AtomicU64,
}

struct Shared {
    driver: &'static Driver,
    context: usize,
    lanes: Vec<Lane>,
    stop: AtomicBool,
}

/// See the module's docs.
pub struct EventLanes {
    shared: Arc<Shared>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

impl EventLanes {
    /// `lanes` rings of events of `context` (current on the calling thread).
    pub fn new(driver: &'static Driver, context: CUcontext, lanes: usize) -> EventLanes {
        let lanes = (0..lanes)
            .map(|_| Lane {
                events: (0..RING)
                    .map(|_| {
                        let mut event: CUevent = std::ptr::null_mut();
                        // SAFETY: a valid out-pointer; the caller's context is current.
                        unsafe {
                            driver
                                .cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
                        }
                        .unwrap();
                        event.expose_provenance()
                    })
                    .collect(),
                issued: AtomicU64::new(0),
                done: AtomicU64::new(0),
            })
            .collect();
        EventLanes {
            shared: Arc::new(Shared {
                driver,
                context: context.expose_provenance(),
                lanes,
                stop: AtomicBool::new(false),
            }),
            poller: Mutex::new(None),
        }
    }

    /// Starts the poller (every lane counts from 0 again), pinned to `cpu` if given.
    pub fn start(&self, cpu: Option<usize>) {
        self.stop();
        let shared = Arc::clone(&self.shared);
        for lane in &shared.lanes {
            lane.issued.store(0, Ordering::SeqCst);
            lane.done.store(0, Ordering::SeqCst);
        }
        shared.stop.store(false, Ordering::SeqCst);
        *self.poller.lock().unwrap() = Some(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                crate::pin_current_thread(cpu);
            }
            poll(&shared);
        }));
    }

    /// Records the next event of lane `lane` on `stream` (the lane's one recording thread), once
    /// its slot is free.
    pub fn record(&self, lane: usize, stream: CUstream) {
        let s = &self.shared;
        let l = &s.lanes[lane];
        let i = l.issued.load(Ordering::Relaxed);
        while i - l.done.load(Ordering::Acquire) >= RING as u64 {
            std::hint::spin_loop();
        }
        let record = s.driver.raw().cuEventRecord().unwrap();
        let event = std::ptr::with_exposed_provenance_mut(l.events[i as usize % RING]);
        // SAFETY: an event of the stream's context, free (the poller saw its last record complete).
        let code = unsafe { record(event, stream) };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
        l.issued.store(i + 1, Ordering::Release);
    }

    /// Waits until the poller saw every record of every lane complete.
    pub fn wait_all(&self) {
        for l in &self.shared.lanes {
            while l.done.load(Ordering::Acquire) < l.issued.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        }
    }

    /// Stops the poller.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(poller) = self.poller.lock().unwrap().take() {
            poller.join().unwrap();
        }
    }
}

impl Drop for EventLanes {
    fn drop(&mut self) {
        self.stop();
        for lane in &self.shared.lanes {
            for &event in &lane.events {
                // SAFETY: an event of this ring, no longer recorded or queried.
                let _ = unsafe {
                    self.shared
                        .driver
                        .cuEventDestroy(std::ptr::with_exposed_provenance_mut(event))
                };
            }
        }
    }
}

fn poll(s: &Shared) {
    let query = s.driver.raw().cuEventQuery().unwrap();
    // SAFETY: the benchmark's primary context, retained for the whole run; a valid in/out mode.
    unsafe {
        s.driver
            .cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(s.context))
            .unwrap();
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        s.driver
            .cuThreadExchangeStreamCaptureMode(&mut mode)
            .unwrap();
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
