//! Events: record, query, synchronize, elapsed time, waits between streams, and events under
//! capture.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_dl_sys::types::{CUevent, CUgraph, CUresult, CUstreamCaptureMode};
use cuda_workspace::testing::bump;

use super::harness::{SETTLE, Shared, cases, code, data, leak};

const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 2;

fn event(driver: &cuda_dl_sys::Driver, flags: u32) -> CUevent {
    let mut event = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuEventCreate(&mut event, flags) }.unwrap();
    event
}

cases! {
    /// An event never recorded is complete. Recorded behind held work it is not ready until the
    /// work is done; `cuEventSynchronize` then returns, and the query says complete.
    fn an_event_completes_when_the_work_before_its_record_is_done(cx) {
        let stream = cx.stream();
        let event = event(cx.driver, 0);
        // SAFETY: a live event.
        unsafe { cx.driver.cuEventQuery(event) }.unwrap();
        let hold = cx.hold(stream);
        // SAFETY: live handles.
        unsafe { cx.driver.cuEventRecord(event, stream) }.unwrap();
        std::thread::sleep(SETTLE);
        // SAFETY: a live event.
        assert_eq!(code(unsafe { cx.driver.cuEventQuery(event) }), Some(CUresult::CUDA_ERROR_NOT_READY));
        let release = hold.releaser();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            release();
        });
        // SAFETY: live handles.
        unsafe {
            cx.driver.cuEventSynchronize(event).unwrap();
            cx.driver.cuEventQuery(event).unwrap();
            cx.driver.cuEventDestroy(event).unwrap();
        }
        releaser.join().unwrap();
    }

    /// A stream that waits on an event runs nothing after the wait until the record is reached;
    /// a value write after the wait lands in mapped host memory when its turn comes.
    fn a_stream_waiting_on_an_event_follows_the_recording_stream(cx) {
        let (first, second) = (cx.stream(), cx.stream());
        let event = event(cx.driver, 0);
        let word = cx.word();
        let count = leak(AtomicUsize::new(0));
        let hold = cx.hold(first);
        // SAFETY: live handles; mapped memory; `count` is leaked.
        unsafe {
            cx.driver.cuEventRecord(event, first).unwrap();
            cx.driver.cuStreamWaitEvent(second, event, 0).unwrap();
            cx.driver.cuStreamWriteValue32(second, word.device, 7, 0).unwrap();
            cx.driver.cuLaunchHostFunc(second, Some(bump), data(count)).unwrap();
            assert_eq!(code(cx.driver.cuStreamQuery(second)), Some(CUresult::CUDA_ERROR_NOT_READY));
        }
        std::thread::sleep(SETTLE);
        assert_eq!((word.host.load(Ordering::Acquire), count.load(Ordering::SeqCst)), (0, 0));
        hold.release();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(second) }.unwrap();
        assert_eq!((word.host.load(Ordering::Acquire), count.load(Ordering::SeqCst)), (7, 1));
    }

    /// `cuEventElapsedTime` between two completed records is at least the time the stream was
    /// held between them; it is `CUDA_ERROR_NOT_READY` while the second is pending, and
    /// `CUDA_ERROR_INVALID_HANDLE` for an event never recorded or made without timing.
    fn elapsed_time_measures_between_two_completed_records(cx) {
        let stream = cx.stream();
        let (start, end) = (event(cx.driver, 0), event(cx.driver, 0));
        let untimed = event(cx.driver, DISABLE_TIMING);
        let mut ms = -1.0f32;
        // SAFETY: live handles; a valid out-pointer.
        unsafe {
            assert_eq!(code(cx.driver.cuEventElapsedTime(&mut ms, start, end)), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
            cx.driver.cuEventRecord(start, stream).unwrap();
            cx.driver.cuEventRecord(untimed, stream).unwrap();
        }
        let hold = cx.hold(stream);
        // SAFETY: live handles; a valid out-pointer.
        unsafe {
            cx.driver.cuEventRecord(end, stream).unwrap();
            cx.driver.cuEventSynchronize(start).unwrap();
            assert_eq!(code(cx.driver.cuEventElapsedTime(&mut ms, start, end)), Some(CUresult::CUDA_ERROR_NOT_READY));
        }
        std::thread::sleep(Duration::from_millis(30));
        hold.release();
        // SAFETY: live handles; a valid out-pointer.
        unsafe {
            cx.driver.cuEventSynchronize(end).unwrap();
            cx.driver.cuEventElapsedTime(&mut ms, start, end).unwrap();
            assert!((25.0..10_000.0).contains(&ms), "{ms} ms");
            assert_eq!(code(cx.driver.cuEventElapsedTime(&mut ms, start, untimed)), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
        }
    }

    /// `cuEventRecord` on a capturing stream succeeds, but the event is a capture marker: a
    /// `cuEventQuery` of it returns `CUDA_ERROR_CAPTURED_EVENT` and invalidates the capture
    /// (`cuStreamEndCapture`: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, no graph); queried after the
    /// capture ended it is `CUDA_ERROR_INVALID_VALUE` (probes/event_facts.c).
    fn querying_an_event_recorded_in_a_capture_invalidates_the_capture(cx) {
        let stream = cx.stream();
        let event = event(cx.driver, 0);
        let mut graph: CUgraph = ptr::dangling_mut();
        // SAFETY: live handles; a valid out-pointer.
        unsafe {
            cx.driver.cuStreamBeginCapture(stream, GLOBAL).unwrap();
            cx.driver.cuEventRecord(event, stream).unwrap();
            assert_eq!(code(cx.driver.cuEventQuery(event)), Some(CUresult::CUDA_ERROR_CAPTURED_EVENT));
            assert_eq!(
                code(cx.driver.cuStreamEndCapture(stream, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert!(graph.is_null());
            assert_eq!(code(cx.driver.cuEventQuery(event)), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        }
    }

    /// `cuEventQuery` works from a thread with no current context.
    fn an_event_query_works_from_a_thread_without_a_context(cx) {
        let stream = cx.stream();
        let event = Shared(event(cx.driver, 0));
        // SAFETY: live handles.
        unsafe {
            cx.driver.cuEventRecord(event.0, stream).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        let driver = cx.driver;
        let result = std::thread::spawn(move || {
            let event = event;
            let mut current = ptr::dangling_mut();
            // SAFETY: a valid out-pointer; a live event.
            unsafe {
                driver.cuCtxGetCurrent(&mut current).unwrap();
                assert!(current.is_null());
                code(driver.cuEventQuery(event.0))
            }
        })
        .join()
        .unwrap();
        assert_eq!(result, None);
    }
}
