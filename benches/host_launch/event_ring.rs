//! The event transport's floor in the benchmark's own process: `cuEventRecord` from a ring of
//! events, and a thread that counts the completed ones (`../shared/probes/memop_transport.c`'s
//! "eventbatch" mode on one stream: the newest record first, and if it completed, every older one
//! with it; its "event" mode, in order, on several streams, whose records complete out of order). None of the library's bookkeeping: no
//! capture query, no pool, no ticket, no hand-over, no owner. `release_after` over this ring is
//! what that bookkeeping costs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUcontext, CUevent, CUevent_flags, CUresult, CUstream, CUstreamCaptureMode,
};

/// Events in the ring: a slot is recorded again only once the poller saw it complete.
const RING: usize = 4096;

struct Shared {
    driver: &'static Driver,
    context: usize,
    events: Vec<usize>,
    /// Records made (written by the one recording thread).
    issued: AtomicU64,
    /// Records the poller saw complete, in order.
    done: AtomicU64,
    stop: AtomicBool,
    /// One stream: the newest record first.
    newest_first: AtomicBool,
}

/// See the module's docs.
pub struct EventRing {
    shared: Arc<Shared>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

impl EventRing {
    /// A ring of events of `context` (current on the calling thread).
    pub fn new(driver: &'static Driver, context: CUcontext) -> EventRing {
        let events = (0..RING)
            .map(|_| {
                let mut event: CUevent = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; the caller's context is current.
                unsafe {
                    driver.cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
                }
                .unwrap();
                event.expose_provenance()
            })
            .collect();
        let shared = Arc::new(Shared {
            driver,
            context: context.expose_provenance(),
            events,
            issued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            newest_first: AtomicBool::new(false),
        });
        EventRing {
            shared,
            poller: Mutex::new(None),
        }
    }

    /// Starts the polling thread (counts from 0 again); `one_stream`: every record will be on one
    /// stream, so the poller may query the newest first.
    pub fn start(&self, one_stream: bool) {
        self.stop();
        let shared = Arc::clone(&self.shared);
        shared.issued.store(0, Ordering::SeqCst);
        shared.done.store(0, Ordering::SeqCst);
        shared.stop.store(false, Ordering::SeqCst);
        shared.newest_first.store(one_stream, Ordering::SeqCst);
        *self.poller.lock().unwrap() = Some(std::thread::spawn(move || poll(&shared)));
    }

    /// Records the next event of the ring on `stream`, once its slot is free.
    pub fn record(&self, stream: CUstream) {
        let s = &self.shared;
        let i = s.issued.load(Ordering::Relaxed);
        while i - s.done.load(Ordering::Acquire) >= RING as u64 {
            std::hint::spin_loop();
        }
        let record = s.driver.raw().cuEventRecord().unwrap();
        let event = std::ptr::with_exposed_provenance_mut(s.events[i as usize % RING]);
        // SAFETY: an event of the stream's context, free (the poller saw its last record complete).
        let code = unsafe { record(event, stream) };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
        s.issued.store(i + 1, Ordering::Release);
    }

    /// Waits until the poller saw every record complete.
    pub fn wait_all(&self) {
        let s = &self.shared;
        while s.done.load(Ordering::Acquire) < s.issued.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    }

    /// Stops the polling thread.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(poller) = self.poller.lock().unwrap().take() {
            poller.join().unwrap();
        }
    }
}

impl Drop for EventRing {
    fn drop(&mut self) {
        self.stop();
        for &event in &self.shared.events {
            // SAFETY: an event of this ring, no longer recorded or queried.
            let _ = unsafe {
                self.shared
                    .driver
                    .cuEventDestroy(std::ptr::with_exposed_provenance_mut(event))
            };
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
    let newest_first = s.newest_first.load(Ordering::SeqCst);
    let mut done = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        let issued = s.issued.load(Ordering::Acquire);
        if newest_first && done < issued {
            let event =
                std::ptr::with_exposed_provenance_mut(s.events[(issued - 1) as usize % RING]);
            // SAFETY: a recorded event of the ring.
            if unsafe { query(event) } == CUresult::CUDA_SUCCESS {
                done = issued;
                s.done.store(done, Ordering::Release);
                continue;
            }
        }
        while done < issued {
            let event = std::ptr::with_exposed_provenance_mut(s.events[done as usize % RING]);
            // SAFETY: a recorded event of the ring.
            if unsafe { query(event) } != CUresult::CUDA_SUCCESS {
                break;
            }
            done += 1;
            s.done.store(done, Ordering::Release);
        }
        std::hint::spin_loop();
    }
}
