//! A sticky error while several threads are launching: the context is poisoned while its host
//! functions are running and more launches arrive (accepted, never run), then reset. Every launch
//! is accounted for exactly once: it ran, or its owners were reclaimed by the reset
//! (`ran + reclaimed == launched`); every owner is dropped exactly once, never on a driver thread;
//! nothing is left pending; the context works again. Three rounds in one process of its own (the
//! reset is process-wide state of the fake).

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cuda_host_launch::{
    Device, PrimaryContext, Stream, flush, host_launch, launch_host_function,
    launch_host_function_with_bytes, pending_launches,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    CountedOwner, DropCounts, PATIENCE, fake, fake_driver_path, load_fake_driver, wait_until,
};

const THREADS: usize = 4;
const PER_THREAD: usize = 3_000;
const ROUNDS: usize = 3;

static RAN: AtomicU64 = AtomicU64::new(0);
static ON_DRIVER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// 0: not known yet; 1: one of the fake's threads; 2: another.
    static DRIVER_THREAD: Cell<u8> = const { Cell::new(0) };
}

fn on_driver_thread() -> bool {
    DRIVER_THREAD.with(|kind| {
        if kind.get() == 0 {
            let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
            kind.set(if comm.starts_with("fake-cuda-") { 1 } else { 2 });
        }
        kind.get() == 1
    })
}

/// Marks its slot (through the counted owner it holds) when dropped, and counts drops on a driver
/// thread.
struct Counted(#[allow(dead_code, reason = "held for its Drop")] CountedOwner);

impl Drop for Counted {
    fn drop(&mut self) {
        if on_driver_thread() {
            ON_DRIVER.fetch_add(1, Ordering::Relaxed);
        }
    }
}

unsafe extern "C" fn count_run(_: *mut c_void) {
    RAN.fetch_add(1, Ordering::Relaxed);
}

/// One round: launch from `THREADS` threads (of both record kinds: pooled, a small closure and a
/// raw launch; boxed, a closure capturing 256 bytes and a bytes launch), poison the context once a third has run, reset.
/// Returns (ran, reclaimed, pending before the reset).
fn round(context: &std::sync::Arc<PrimaryContext>, drops: DropCounts) -> (u64, usize) {
    let total = THREADS * PER_THREAD;
    RAN.store(0, Ordering::SeqCst);
    context.set_current().unwrap();
    let streams: Vec<Stream> = (0..THREADS)
        .map(|_| Stream::new_non_blocking(context).unwrap())
        .collect();
    let launched = AtomicUsize::new(0);
    let poisoned_at = std::thread::scope(|s| {
        for (t, stream) in streams.iter().enumerate() {
            let launched = &launched;
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    let owner = Counted(drops.owner(t * PER_THREAD + i));
                    match i % 4 {
                        0 => host_launch(stream, move || {
                            let _keep = &owner;
                            RAN.fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap(),
                        // SAFETY: `count_run` ignores its argument and does not unwind.
                        1 => unsafe {
                            launch_host_function(stream, Some(count_run), ptr::null_mut(), owner)
                        }
                        .unwrap(),
                        2 => {
                            // Too big for a pool slot: a boxed record.
                            let big = [i as u8; 256];
                            let f = move || {
                                let _keep = &owner;
                                RAN.fetch_add(u64::from(big[0] == big[255]), Ordering::Relaxed);
                            };
                            assert!(size_of_val(&f) > 128);
                            host_launch(stream, f).unwrap();
                        }
                        _ => {
                            // A bytes record (always boxed) owns nothing: its slot is marked here,
                            // and it is accounted for by `ran + reclaimed == launched`.
                            drop(owner);
                            // SAFETY: `count_run` ignores its argument and does not unwind.
                            unsafe {
                                launch_host_function_with_bytes(stream, Some(count_run), &[7; 40])
                            }
                            .unwrap();
                        }
                    }
                    launched.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Poison while host functions run and launches keep coming.
        let deadline = Instant::now() + PATIENCE;
        while RAN.load(Ordering::Relaxed) < (total / 3) as u64 {
            assert!(Instant::now() < deadline, "the host functions do not run");
            std::hint::spin_loop();
        }
        let at = (RAN.load(Ordering::SeqCst), launched.load(Ordering::SeqCst));
        fake()
            .poison_context(context.raw())
            .expect("the fake could not poison the context");
        at
    });
    // The launches after the poison were accepted; none of them runs.
    wait_until("the poisoned context to stop", PATIENCE, || {
        fake().pending_host_functions(context.raw()) == 0
    });
    let ran = RAN.load(Ordering::SeqCst);
    let pending = pending_launches(Some(context.raw()));
    assert_eq!(
        ran + pending as u64,
        total as u64,
        "ran + pending before the reset"
    );
    for stream in &streams {
        assert!(stream.synchronize().is_err(), "a sticky error");
    }
    drop(streams);
    // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
    let reclaimed = unsafe { context.reset() }.unwrap();
    flush(Duration::from_secs(10)).unwrap();
    println!(
        "  poisoned after {} ran of {} launched; in the end {ran} ran, {reclaimed} reclaimed, of \
         {total}",
        poisoned_at.0, poisoned_at.1
    );
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        ran,
        "a host function ran after the reset"
    );
    assert_eq!(
        ran + reclaimed as u64,
        total as u64,
        "ran + reclaimed == launched"
    );
    (ran, reclaimed)
}

isolated_test! {
    /// Three rounds of: 4 threads × 3000 launches, the context poisoned once a third have run
    /// (host functions running, launches still arriving), then reset. Every launch either ran or
    /// was reclaimed, exactly once; every owner dropped exactly once, none on a driver thread;
    /// nothing pending; the context works again after each reset.
    fn a_sticky_error_under_load_accounts_for_every_launch_exactly_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let started = Instant::now();
        let mut totals = (0, 0);
        for _ in 0..ROUNDS {
            let drops = DropCounts::new(THREADS * PER_THREAD);
            let (ran, reclaimed) = round(&context, drops);
            totals = (totals.0 + ran, totals.1 + reclaimed);
            let deadline = Instant::now() + PATIENCE;
            while drops.never() > 0 {
                assert!(Instant::now() < deadline, "owners never dropped");
                flush(PATIENCE).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(drops.more_than_once(), 0, "owners dropped twice");
            assert_eq!(pending_launches(None), 0);
        }
        assert!(totals.0 > 0 && totals.1 > 0, "both outcomes happened: {totals:?}");
        assert_eq!(ON_DRIVER.load(Ordering::SeqCst), 0, "owners dropped on a driver thread");
        assert_eq!(fake().driver_thread_call_count(""), 0);

        // The context works after the last reset.
        context.set_current().unwrap();
        let stream = Stream::new(&context).unwrap();
        let before = RAN.load(Ordering::SeqCst);
        host_launch(&stream, || {
            RAN.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(RAN.load(Ordering::SeqCst), before + 1);
        println!(
            "{ROUNDS} rounds of {} launches in {:?}: {} ran, {} reclaimed, each owner dropped once",
            THREADS * PER_THREAD,
            started.elapsed(),
            totals.0,
            totals.1
        );
    }
}
