//! Events: records that complete in stream order, waits on them, and their role in capture (a
//! record in a capture lets another stream join it).

use std::ffi::c_uint;
use std::sync::Arc;

use cuda_dl_sys::types::{CUevent, CUstream};

use crate::capture;
use crate::context::current;
use crate::errors::{
    CAPTURE_INVALIDATED, CAPTURE_ISOLATION, CAPTURED_EVENT, INVALID_HANDLE, INVALID_VALUE,
    LAUNCH_FAILED, NOT_PERMITTED, NOT_READY, Res, ensure, result,
};
use crate::scheduler::{enqueue, on_worker_of};
use crate::state::{Event, Op, Record, State, as_ptr, lock, new_handle, wait};
use crate::stream::resolve;

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: c_uint = 2;

/// `CU_EVENT_WAIT_EXTERNAL`, the one wait flag.
const WAIT_EXTERNAL: c_uint = 1;

/// Whether the event's context has a sticky error, which the caller reports now.
fn event_ctx_poisoned(st: &State, event: &Event) -> bool {
    st.contexts
        .get(&event.ctx)
        .is_some_and(|c| c.reports_poison())
}

export!("cuEventCreate", cuEventCreate => event_create(phEvent: *mut CUevent, Flags: c_uint));
unsafe fn event_create(ph: *mut CUevent, flags: c_uint) -> Res {
    ensure(!ph.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let ctx = current(&st)?;
    let handle = new_handle();
    st.events.insert(
        handle,
        Event {
            ctx,
            last_record: None,
            timing: flags & DISABLE_TIMING == 0,
            capture: None,
        },
    );
    // SAFETY: non-null, and the caller passes a valid place for an event handle.
    unsafe { ph.write(as_ptr(handle)) };
    Ok(())
}

unsafe fn event_destroy(event: CUevent) -> Res {
    // A record or wait still queued keeps its own completion flag, so it completes regardless.
    lock()
        .events
        .remove(&event.addr())
        .map(|_| ())
        .ok_or_else(crate::oracle::unknown_event)
}
export!("cuEventDestroy", cuEventDestroy => event_destroy(hEvent: CUevent));
export!("cuEventDestroy", cuEventDestroy_v2 => event_destroy(hEvent: CUevent));

stream_export!("cuEventRecord", cuEventRecord / cuEventRecord_ptsz => event_record(hEvent: CUevent, hStream: CUstream));
unsafe fn event_record(event: CUevent, handle: CUstream, per_thread: bool) -> Res {
    let mut st = lock();
    if !st.events.contains_key(&event.addr()) {
        return Err(crate::oracle::unknown_event());
    }
    let s = resolve(&mut st, handle, per_thread)?;
    let captured = st.streams[&s]
        .capture
        .as_ref()
        .map(|cap| (cap.id, cap.deps.clone()));
    if let Some((id, deps)) = captured {
        let invalidated = st.captures.get(&id).is_none_or(|c| c.invalidated);
        ensure(!invalidated, CAPTURE_INVALIDATED)?;
        if let Some(e) = st.events.get_mut(&event.addr()) {
            e.capture = Some((id, deps));
        }
        return Ok(());
    }
    let record = Arc::new(Record::default());
    if let Some(e) = st.events.get_mut(&event.addr()) {
        e.last_record = Some(Arc::clone(&record));
        e.capture = None;
    }
    result(enqueue(&mut st, s, Op::Record { record }))
}

stream_export!("cuEventRecordWithFlags", cuEventRecordWithFlags / cuEventRecordWithFlags_ptsz => event_record_with_flags(hEvent: CUevent, hStream: CUstream, flags: c_uint));
unsafe fn event_record_with_flags(
    event: CUevent,
    handle: CUstream,
    _flags: c_uint,
    per_thread: bool,
) -> Res {
    // SAFETY: the same contract as cuEventRecord.
    unsafe { event_record(event, handle, per_thread) }
}

export!("cuEventQuery", cuEventQuery => event_query(hEvent: CUevent));
unsafe fn event_query(event: CUevent) -> Res {
    let captured = lock()
        .events
        .get(&event.addr())
        .is_some_and(|e| e.capture.is_some());
    if !captured {
        crate::capture_mode::check("cuEventQuery")?;
    }
    let mut st = lock();
    let e = st
        .events
        .get(&event.addr())
        .ok_or_else(crate::oracle::unknown_event)?;
    if let Some((id, _)) = e.capture {
        // Recorded in a capture, the event is a marker, not work (measured: probes/event_facts.c):
        // queried while the capture lasts, it invalidates it; after, it is an invalid value.
        let stream = st
            .captures
            .get(&id)
            .filter(|c| !c.invalidated)
            .map(|c| c.origin);
        return match stream {
            Some(stream) => {
                capture::invalidate(&mut st, stream);
                Err(CAPTURED_EVENT)
            }
            None if st.captures.contains_key(&id) => Err(CAPTURED_EVENT),
            None => Err(INVALID_VALUE),
        };
    }
    ensure(!event_ctx_poisoned(&st, e), LAUNCH_FAILED)?;
    let done = e.last_record.as_ref().is_none_or(|r| r.done());
    ensure(done, NOT_READY)
}

export!("cuEventSynchronize", cuEventSynchronize => event_synchronize(hEvent: CUevent));
unsafe fn event_synchronize(event: CUevent) -> Res {
    let mut st = lock();
    loop {
        let Some(e) = st.events.get(&event.addr()) else {
            return Err(crate::oracle::unknown_event());
        };
        ensure(!event_ctx_poisoned(&st, e), LAUNCH_FAILED)?;
        let Some(done) = e.last_record.clone() else {
            return Ok(());
        };
        if done.done() {
            return Ok(());
        }
        ensure(!on_worker_of(e.ctx), NOT_PERMITTED)?;
        st = wait(st);
    }
}

stream_export!("cuStreamWaitEvent", cuStreamWaitEvent / cuStreamWaitEvent_ptsz => stream_wait_event(hStream: CUstream, hEvent: CUevent, Flags: c_uint));
unsafe fn stream_wait_event(
    handle: CUstream,
    event: CUevent,
    flags: c_uint,
    per_thread: bool,
) -> Res {
    ensure(flags & !WAIT_EXTERNAL == 0, INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let e = st
        .events
        .get(&event.addr())
        .ok_or_else(crate::oracle::unknown_event)?;
    let record_capture = e
        .capture
        .clone()
        .filter(|(id, _)| st.captures.contains_key(id));
    if let Some((id, deps)) = record_capture {
        // A stream forked into (or merging within) a capture.
        return capture::join(&mut st, s, id, &deps);
    }
    let done = e.last_record.clone();
    if capture::is_capturing(&st, s) {
        // Waiting on uncaptured work from inside a capture: not modelled (the real driver can add
        // an external wait node); reported as the isolation error and the capture invalidated.
        capture::invalidate(&mut st, s);
        return Err(CAPTURE_ISOLATION);
    }
    match done {
        Some(record) if !record.done() => result(enqueue(&mut st, s, Op::Wait { record })),
        _ => Ok(()),
    }
}

export!("cuEventElapsedTime", cuEventElapsedTime => event_elapsed_time(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent));
export!("cuEventElapsedTime", cuEventElapsedTime_v2 => event_elapsed_time(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent));
/// The milliseconds between the completions of the two events' last records (measured on the
/// host when the driver thread completes them): `CUDA_ERROR_INVALID_HANDLE` if either keeps no
/// timestamps or was never recorded, `CUDA_ERROR_NOT_READY` if either has not completed.
unsafe fn event_elapsed_time(ms: *mut f32, start: CUevent, end: CUevent) -> Res {
    ensure(!ms.is_null(), INVALID_VALUE)?;
    let st = lock();
    let mut at = [None, None];
    for (slot, event) in at.iter_mut().zip([start, end]) {
        let e = st.events.get(&event.addr()).ok_or(INVALID_HANDLE)?;
        ensure(e.timing, INVALID_HANDLE)?;
        ensure(!event_ctx_poisoned(&st, e), LAUNCH_FAILED)?;
        let recorded = e.last_record.as_ref().ok_or(INVALID_HANDLE)?;
        *slot = Some(recorded.completed_at().ok_or(NOT_READY)?);
    }
    let [Some(start), Some(end)] = at else {
        return Err(INVALID_HANDLE);
    };
    let elapsed = if end >= start {
        end.duration_since(start).as_secs_f64() * 1000.0
    } else {
        -(start.duration_since(end).as_secs_f64() * 1000.0)
    };
    // SAFETY: non-null, and the caller passes a valid place for a float.
    unsafe { ms.write(elapsed as f32) };
    Ok(())
}
