//! Host launches on the fake driver: they return at once, run in stream order, see what the caller
//! wrote before the stream reached them, and their owners are dropped exactly once, after the
//! function returned, by the reaper: neither on the driver's thread nor on the launching one. Also:
//! copied bytes, and streams made elsewhere (`RawStream`).
//!
//! The tests share one process (and its reaper and primary context), each with its own streams;
//! the one that needs the driver loaded differently has a process of its own.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_dl_sys::types::{CUresult, CUstream};
use cuda_host_launch::{
    Device, Error, Event, PrimaryContext, RawStream, Stream, flush, host_launch,
    launch_host_function, launch_host_function_with_bytes,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    DropRecord, Drops, RanOn, ThreadInfo, fake, fake_driver_path, fake_primary_context,
    load_fake_driver,
};

const FLUSH: Duration = Duration::from_secs(10);

/// A host function that takes a little while, so that work wrongly run beside it (rather than
/// after it) would be seen doing so.
const SLOW: Duration = Duration::from_millis(10);

/// What the raw host functions below share with the test, through their `user_data`.
#[derive(Default)]
struct Shared {
    /// Written by the test after the launch returned.
    input: AtomicU32,
    /// What the function read from `input`.
    seen: AtomicU32,
    /// Set as the function's last act.
    returned: Arc<AtomicBool>,
    ran_on: Arc<RanOn>,
}

unsafe extern "C" fn read_input(data: *mut c_void) {
    // SAFETY: every launch passes a pointer into an `Arc<Shared>` that an owner keeps alive.
    let shared = unsafe { &*data.cast::<Shared>() };
    shared.ran_on.here();
    shared
        .seen
        .store(shared.input.load(Ordering::SeqCst), Ordering::SeqCst);
    std::thread::sleep(SLOW);
    shared.returned.store(true, Ordering::SeqCst);
}

fn user_data(shared: &Arc<Shared>) -> *mut c_void {
    Arc::as_ptr(shared).cast_mut().cast()
}

/// Every record says: dropped once, by the reaper, after the function returned, on neither the
/// driver's thread nor the launcher's.
#[track_caller]
fn assert_dropped_by_the_reaper_after_return(
    records: &[DropRecord],
    driver: &ThreadInfo,
    launcher: &ThreadInfo,
) {
    for record in records {
        assert_eq!(
            record.flag,
            Some(true),
            "dropped before the function returned: {record:?}"
        );
        assert!(
            !record.thread.same_as(driver),
            "dropped on the driver's thread: {record:?}"
        );
        assert_ne!(
            record.thread.os_id, driver.os_id,
            "dropped on the driver's thread"
        );
        assert!(
            !record.thread.same_as(launcher),
            "dropped on the launching thread: {record:?}"
        );
        assert!(
            record.thread.is_reaper(),
            "not dropped by the reaper: {record:?}"
        );
    }
}

#[test]
fn a_closure_launch_returns_while_the_stream_is_held_and_runs_in_stream_order() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let other = Stream::new(&context).unwrap();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");

    let input = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(AtomicU32::new(u32::MAX));
    let log: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let first_returned = Arc::new(AtomicBool::new(false));
    {
        let (input, seen, log, returned) = (
            Arc::clone(&input),
            Arc::clone(&seen),
            Arc::clone(&log),
            Arc::clone(&first_returned),
        );
        host_launch(&stream, move || {
            seen.store(input.load(Ordering::SeqCst), Ordering::SeqCst);
            std::thread::sleep(SLOW);
            log.lock().unwrap().push("first");
            returned.store(true, Ordering::SeqCst);
        })
        .unwrap();
    }
    // The launch returned with the stream still held: nothing has run.
    assert_eq!(seen.load(Ordering::SeqCst), u32::MAX);
    assert!(!stream.is_idle().unwrap());

    // Work enqueued after it: an event (which another stream waits for), then host functions.
    let after = Event::new(&context).unwrap();
    after.record(&stream).unwrap();
    after.make_wait(&other).unwrap();
    let (on_stream, on_other) = (Arc::clone(&log), Arc::clone(&log));
    let (saw_first_on_stream, saw_first_on_other) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    {
        let (returned, saw) = (
            Arc::clone(&first_returned),
            Arc::clone(&saw_first_on_stream),
        );
        host_launch(&stream, move || {
            saw.store(returned.load(Ordering::SeqCst), Ordering::SeqCst);
            on_stream.lock().unwrap().push("second");
        })
        .unwrap();
    }
    {
        let (returned, saw) = (Arc::clone(&first_returned), Arc::clone(&saw_first_on_other));
        host_launch(&other, move || {
            saw.store(returned.load(Ordering::SeqCst), Ordering::SeqCst);
            on_other.lock().unwrap().push("other stream");
        })
        .unwrap();
    }
    assert!(!after.is_complete().unwrap());
    assert!(!other.is_idle().unwrap(), "the other stream did not wait");

    // The test thread writes after the launch returned; the function reads it when it runs.
    input.store(42, Ordering::SeqCst);
    hold.release();

    after.synchronize().unwrap();
    assert!(
        first_returned.load(Ordering::SeqCst),
        "the event completed before the host function before it returned"
    );
    stream.synchronize().unwrap();
    other.synchronize().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 42);
    assert!(saw_first_on_stream.load(Ordering::SeqCst));
    assert!(saw_first_on_other.load(Ordering::SeqCst));
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!(log[0], "first", "{log:?}");
}

#[test]
fn a_raw_launch_returns_while_the_stream_is_held_and_sees_what_was_written_before_it_ran() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    let shared = Arc::new(Shared::default());
    // SAFETY: `read_input` only touches the `Shared` that the owner (a clone of the Arc) keeps
    // alive, and does not unwind.
    unsafe {
        launch_host_function(
            &stream,
            Some(read_input),
            user_data(&shared),
            Arc::clone(&shared),
        )
    }
    .unwrap();
    assert!(
        !shared.returned.load(Ordering::SeqCst),
        "ran while the stream was held"
    );
    assert!(
        fake().pending_host_functions(context.raw()) >= 1,
        "not pending"
    );
    shared.input.store(7, Ordering::SeqCst);

    // A stream synchronize waits for the host function, as does a host function after it.
    let after_saw_return = Arc::new(AtomicBool::new(false));
    {
        let (shared, saw) = (Arc::clone(&shared), Arc::clone(&after_saw_return));
        host_launch(&stream, move || {
            saw.store(shared.returned.load(Ordering::SeqCst), Ordering::SeqCst);
        })
        .unwrap();
    }
    hold.release();
    stream.synchronize().unwrap();
    assert!(shared.returned.load(Ordering::SeqCst));
    assert_eq!(shared.seen.load(Ordering::SeqCst), 7);
    assert!(after_saw_return.load(Ordering::SeqCst));
    let driver = shared.ran_on.only();
    assert!(!driver.same_as(&ThreadInfo::current()));
    assert!(driver.os_name.starts_with("fake-cuda-drive"), "{driver:?}");
}

#[test]
fn a_closures_captures_are_dropped_once_after_it_returned_by_the_reaper() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let drops = Drops::new();
    let returned = Arc::new(AtomicBool::new(false));
    let ran_on = RanOn::new();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    {
        let owner = drops.owner_watching(&returned);
        let (returned, ran_on) = (Arc::clone(&returned), Arc::clone(&ran_on));
        host_launch(&stream, move || {
            let _keep = &owner;
            ran_on.here();
            std::thread::sleep(SLOW);
            returned.store(true, Ordering::SeqCst);
        })
        .unwrap();
    }
    assert_eq!(drops.dropped(), 0, "dropped before the stream reached it");
    hold.release();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    let records = drops.wait_dropped(1);
    assert_eq!(drops.live(), 0);
    assert_dropped_by_the_reaper_after_return(&records, &ran_on.only(), &ThreadInfo::current());
}

#[test]
fn a_raw_launchs_owners_are_dropped_once_after_it_returned_by_the_reaper() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let drops = Drops::new();
    let shared = Arc::new(Shared::default());
    let owners = (
        drops.owner_watching(&shared.returned),
        Arc::clone(&shared),
        drops.owner_watching(&shared.returned),
    );
    // SAFETY: `read_input` only touches the `Shared` the owners keep alive, and does not unwind.
    unsafe { launch_host_function(&stream, Some(read_input), user_data(&shared), owners) }.unwrap();
    stream.synchronize().unwrap();
    let records = drops.wait_dropped(2);
    assert_eq!(drops.live(), 0);
    assert_eq!(
        Arc::strong_count(&shared),
        1,
        "the Arc owner was not dropped"
    );
    assert_dropped_by_the_reaper_after_return(
        &records,
        &shared.ran_on.only(),
        &ThreadInfo::current(),
    );
}

/// The bytes a `copy_out` host function saw: the address it was given and 40 bytes from there.
static BYTES_SEEN: Mutex<Vec<(usize, Vec<u8>)>> = Mutex::new(Vec::new());
const BYTES: usize = 40;

unsafe extern "C" fn copy_out(data: *mut c_void) {
    // SAFETY: every launch of `copy_out` below passes `BYTES` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), BYTES) };
    BYTES_SEEN
        .lock()
        .unwrap()
        .push((data.addr(), bytes.to_vec()));
}

unsafe extern "C" fn note_address(data: *mut c_void) {
    BYTES_SEEN.lock().unwrap().push((data.addr(), Vec::new()));
}

#[test]
fn copied_bytes_are_what_the_caller_passed_even_if_its_buffer_changes_or_goes_away() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    let mut buffer: Vec<u8> = (0..BYTES as u8).collect();
    let other: Vec<u8> = (0..BYTES as u8).rev().collect();
    // SAFETY: `copy_out` reads exactly `BYTES` bytes and does not unwind.
    unsafe { launch_host_function_with_bytes(&stream, Some(copy_out), &buffer) }.unwrap();
    buffer.fill(0xEE);
    drop(buffer);
    // An odd offset into a buffer: the copy is aligned whatever the source's alignment.
    let mut unaligned = [0u8; BYTES + 1];
    unaligned[1..].copy_from_slice(&other);
    // SAFETY: as above.
    unsafe { launch_host_function_with_bytes(&stream, Some(copy_out), &unaligned[1..]) }.unwrap();
    unaligned.fill(0);
    // SAFETY: `note_address` reads nothing.
    unsafe { launch_host_function_with_bytes(&stream, Some(note_address), &[]) }.unwrap();
    assert!(BYTES_SEEN.lock().unwrap().is_empty(), "ran while held");
    hold.release();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();

    let seen = BYTES_SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].1, (0..BYTES as u8).collect::<Vec<_>>());
    assert_eq!(seen[1].1, other);
    for (address, _) in &seen {
        assert_eq!(
            address % 16,
            0,
            "the copy at {address:#x} is not 16-byte aligned"
        );
    }
}

#[test]
fn a_stream_made_through_cuda_sys_alone_works_through_raw_stream() {
    let context = fake_primary_context();
    context.set_current().unwrap();
    let driver = load_fake_driver();
    let mut raw: CUstream = ptr::null_mut();
    // SAFETY: a context is current; `raw` is a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut raw, 0) }.unwrap();
    // SAFETY: `raw` stays a live stream until the cuStreamDestroy at the end, after its last use.
    let stream = unsafe { RawStream::from_raw(raw) };
    assert_eq!(stream.raw(), raw);

    let hold = fake()
        .hold_stream(raw)
        .expect("the fake could not hold the stream");
    let drops = Drops::new();
    let ran = Arc::new(AtomicU32::new(0));
    {
        let (ran, owner) = (Arc::clone(&ran), drops.owner());
        host_launch(stream, move || {
            let _keep = &owner;
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let shared = Arc::new(Shared::default());
    // SAFETY: `read_input` only touches the `Shared` that the owner keeps alive.
    unsafe {
        launch_host_function(
            stream,
            Some(read_input),
            user_data(&shared),
            Arc::clone(&shared),
        )
    }
    .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    hold.release();
    // SAFETY: a live stream, destroyed once, after its last use.
    unsafe {
        driver.cuStreamSynchronize(raw).unwrap();
        driver.cuStreamDestroy(raw).unwrap();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(shared.returned.load(Ordering::SeqCst));
    drops.wait_dropped(1);
}

/// Launches on `launch_on` (a special handle) while `hold_on` (the same stream by another name) is
/// held, and checks the function runs only once the hold is released, with a synchronize of
/// `launch_on` waiting for it.
fn launch_behind_a_hold(hold_on: RawStream, launch_on: RawStream) {
    let driver = cuda_dl_sys::driver().unwrap();
    let hold = fake()
        .hold_stream(hold_on.raw())
        .unwrap_or_else(|| panic!("the fake could not hold {hold_on:?}"));
    let ran = Arc::new(AtomicBool::new(false));
    let drops = Drops::new();
    {
        let (ran, owner) = (Arc::clone(&ran), drops.owner());
        host_launch(launch_on, move || {
            let _keep = &owner;
            std::thread::sleep(SLOW);
            ran.store(true, Ordering::SeqCst);
        })
        .unwrap();
    }
    assert!(
        !ran.load(Ordering::SeqCst),
        "ran while {hold_on:?} was held"
    );
    hold.release();
    // SAFETY: a special handle, with a current context on this thread.
    unsafe { driver.cuStreamSynchronize(launch_on.raw()) }.unwrap();
    assert!(ran.load(Ordering::SeqCst), "{launch_on:?}");
    drops.wait_dropped(1);
}

#[test]
fn the_legacy_and_per_thread_default_streams_work_with_a_current_context() {
    let context = fake_primary_context();
    // On a thread of its own, which has a current context, and its own per-thread stream.
    std::thread::spawn(move || {
        context.set_current().unwrap();
        launch_behind_a_hold(RawStream::LEGACY, RawStream::LEGACY);
        launch_behind_a_hold(RawStream::PER_THREAD, RawStream::PER_THREAD);
        // The driver was loaded with the legacy default stream, so 0 is the legacy stream.
        launch_behind_a_hold(RawStream::LEGACY, RawStream::DEFAULT);
    })
    .join()
    .unwrap();
}

isolated_test! {
    /// With the driver loaded for per-thread default streams, the null stream
    /// (`RawStream::DEFAULT`) is the calling thread's per-thread stream, reached through the
    /// `_ptsz` entry; `LEGACY` and `PER_THREAD` mean what they say in either mode.
    fn in_per_thread_mode_the_null_stream_is_the_calling_threads_own(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM = "1"
    ) {
        let driver = cuda_dl_sys::driver().unwrap();
        assert_eq!(driver.default_stream(), cuda_dl_sys::DefaultStream::PerThread);
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        context.set_current().unwrap();
        launch_behind_a_hold(RawStream::PER_THREAD, RawStream::DEFAULT);
        launch_behind_a_hold(RawStream::PER_THREAD, RawStream::PER_THREAD);
        launch_behind_a_hold(RawStream::LEGACY, RawStream::LEGACY);
        assert_eq!(fake().call_count("cuLaunchHostFunc_ptsz"), 3);
        assert_eq!(fake().call_count("cuLaunchHostFunc"), 3);
    }
}

#[test]
fn a_launch_on_a_default_stream_without_a_current_context_fails_and_hands_its_owners_back() {
    fake_primary_context();
    std::thread::spawn(|| {
        let drops = Drops::new();
        let owner = drops.owner();
        let me = ThreadInfo::current();
        let refused = host_launch(RawStream::LEGACY, move || {
            let _keep = &owner;
        });
        assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
        let refused = refused.map_err(|e| {
            assert!(e.is_handed_back(), "{e:?}");
            // Taken for an `Error` (what `?` does): the owners are dropped here.
            e.into_error()
        });
        assert_eq!(drops.dropped(), 1, "the owners outlived the caller's drop");
        assert!(drops.records()[0].thread.same_as(&me));
        match refused {
            Err(e @ Error::NoCurrentContext { .. }) => {
                assert_eq!(e.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
            }
            other => panic!("expected CUDA_ERROR_INVALID_CONTEXT, got {other:?}"),
        }
    })
    .join()
    .unwrap();
}
