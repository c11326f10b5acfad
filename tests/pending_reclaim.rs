//! Launches whose host function will never run (a sticky context error) are tracked per context and
//! their owners reclaimed once the context is reset or destroyed; a normal destroy runs them first
//! and nothing is released twice. Against the fake driver, each case in its own process.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_host_launch::{
    AsRawStream, Device, PrimaryContext, RawStream, Stream, flush, host_launch,
    launch_host_function, launch_host_function_with_bytes, pending_launches, reclaim_pending,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{address_bytes, bump, bump_from_bytes};
use cuda_workspace::testing::{fake, fake_driver_path, load_fake_driver};

const N: usize = 200;

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// How many of [`launch_counted`]'s `N` launches have an owner: all but the bytes launches.
const OWNED: usize = N - N / 4;

/// Launches `N` host functions on `stream`, of both record kinds: pooled (a small closure, a raw
/// launch with a small owner) and boxed (a closure capturing 256 bytes, too big for a pool slot, and
/// a bytes launch); each counts its run in `ran`, and each but the bytes launches holds a counted
/// owner.
fn launch_counted<S: AsRawStream + Copy>(
    stream: S,
    ran: &Arc<AtomicUsize>,
    dropped: &Arc<AtomicUsize>,
) {
    let counted = || Counted(Arc::clone(dropped));
    for i in 0..N {
        match i % 4 {
            0 => {
                let (ran, owner) = (Arc::clone(ran), counted());
                host_launch(stream, move || {
                    let _keep = &owner;
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            }
            1 => {
                let data = Arc::as_ptr(ran).cast_mut().cast();
                let owners = (counted(), Arc::clone(ran));
                // SAFETY: `bump` only touches the counter kept alive by the owners.
                unsafe { launch_host_function(stream, Some(bump), data, owners) }.unwrap();
            }
            2 => {
                let (ran, owner, big) = (Arc::clone(ran), counted(), [i as u8; 256]);
                let f = move || {
                    let _keep = &owner;
                    ran.fetch_add(usize::from(big[0] == big[255]), Ordering::SeqCst);
                };
                assert!(size_of_val(&f) > 128, "a closure too big for a pool slot");
                host_launch(stream, f).unwrap();
            }
            _ => {
                let bytes = address_bytes::<64>(ran);
                // SAFETY: `bump_from_bytes` gets the address of `ran`, which outlives the process's
                // host functions (the tests keep it until the end).
                unsafe { launch_host_function_with_bytes(stream, Some(bump_from_bytes), &bytes) }
                    .unwrap();
            }
        }
    }
}

/// A primary context of the fake driver and a stream of it with `N` counted launches pending
/// behind a hold, and the context then poisoned (a sticky error) before the hold is released:
/// none of them will ever run. Returns (context, stream, ran, dropped).
fn poisoned_with_pending_launches() -> (
    Arc<PrimaryContext>,
    Stream,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
) {
    load_fake_driver();
    let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
    let stream = Stream::new(&context).unwrap();
    let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    launch_counted(&stream, &ran, &dropped);
    assert_eq!(context.pending_launches(), N);
    fake()
        .poison_context(context.raw())
        .expect("the fake could not poison the context");
    hold.release();
    (context, stream, ran, dropped)
}

isolated_test! {
    /// The tickets' memory: whole chunks of 4,096 tickets, which launches one after another reuse (the count of launches pending at once is what
    /// grows it, not the count of launches).
    fn launch_tickets_are_allocated_in_chunks_and_reused(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = cuda_workspace::testing::fake_primary_context();
        let stream = cuda_host_launch::Stream::new(&context).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let launch = || {
            let ran = Arc::clone(&ran);
            cuda_host_launch::host_launch(&stream, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
            stream.synchronize().unwrap();
        };
        launch();
        let chunk = cuda_host_launch::launch_ticket_bytes();
        assert!(chunk >= 4096 && chunk.is_multiple_of(4096), "one chunk of 4,096 tickets: {chunk} bytes");
        for _ in 0..100 {
            launch();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 101);
        assert_eq!(cuda_host_launch::launch_ticket_bytes(), chunk, "reused, not grown");
    }

    /// Pending host functions of a poisoned context never run; `reset` reclaims all their owners,
    /// each dropped once.
    fn a_reset_after_a_sticky_error_reclaims_every_pending_owner(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (context, stream, ran, dropped) = poisoned_with_pending_launches();
        assert!(stream.synchronize().is_err(), "a sticky error");
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!((ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)), (0, 0));
        assert_eq!(pending_launches(None), N);
        drop(stream);
        // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
        let reclaimed = unsafe { context.reset() }.unwrap();
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(reclaimed, N, "pooled and boxed records reclaimed");
        assert_eq!(dropped.load(Ordering::SeqCst), OWNED);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pending_launches(None), 0);
        // The context works again.
        context.set_current().unwrap();
        let stream = Stream::new(&context).unwrap();
        let again = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&again);
        host_launch(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(again.load(Ordering::SeqCst), 1);
    }

    /// The last release of a poisoned primary context resets it: the owners are reclaimed too.
    fn the_last_release_of_a_poisoned_primary_context_reclaims_its_owners(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (context, stream, ran, dropped) = poisoned_with_pending_launches();
        drop(stream);
        drop(context);
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), OWNED);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The same on a driver without context ids (11.8: no `cuCtxGetId`), where the reclaim cannot
    /// tell contexts of one handle apart and takes the handle's work once it names no context.
    /// (Mutation testing: with that test inverted, nothing was reclaimed.)
    fn the_last_release_of_a_poisoned_primary_context_reclaims_its_owners_without_context_ids(
        FAKE_CUDA_VERSION = "11080",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (context, stream, ran, dropped) = poisoned_with_pending_launches();
        drop(stream);
        drop(context);
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), OWNED);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// `cuCtxDestroy` of a healthy context runs its pending host functions first: a reclaim then
    /// finds nothing, and every owner is dropped exactly once.
    fn a_normal_destroy_runs_pending_functions_first_and_owners_drop_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let d = load_fake_driver();
        let mut device = 0;
        let (mut context, mut raw) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: valid out-pointers; a context of our own with a stream.
        unsafe {
            d.cuDeviceGet(&mut device, 0).unwrap();
            d.cuCtxCreate(&mut context, ptr::null_mut(), 0, device).unwrap();
            d.cuStreamCreate(&mut raw, 0).unwrap();
        }
        let hold = fake().hold_stream(raw).expect("the fake could not hold the stream");
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // SAFETY: `raw` is live until the context is destroyed, after the launches.
        let stream = unsafe { RawStream::from_raw(raw) };
        launch_counted(stream, &ran, &dropped);
        assert_eq!(pending_launches(Some(context)), N);
        hold.release();
        // SAFETY: our context, destroyed once; it runs the pending host functions first.
        unsafe { d.cuCtxDestroy(context) }.unwrap();
        // SAFETY: destroyed; nothing launches into it.
        let reclaimed = unsafe { reclaim_pending(context) };
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(reclaimed, 0);
        assert_eq!(ran.load(Ordering::SeqCst), N);
        assert_eq!(dropped.load(Ordering::SeqCst), OWNED);
        assert_eq!(pending_launches(None), 0);
    }

    /// A launch the driver refused leaves nothing a later reclaim could take for pending: its
    /// owners are dropped once, at the refusal, though its pool slot (written, published, marked
    /// pending before the driver was called) is still read by a reclaim's walk over the pool.
    fn a_refused_launch_is_not_reclaimed_later_and_its_owners_drop_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        // Every third launch is refused (out of memory); the others stay pending behind the hold.
        let mut refused = 0;
        for i in 0..30 {
            if i % 3 == 0 {
                fake().set_fault("cuLaunchHostFunc", 1, 2);
            }
            let owner = Counted(Arc::clone(&dropped));
            let counter = Arc::clone(&ran);
            let result = host_launch(&stream, move || {
                let _keep = &owner;
                counter.fetch_add(1, Ordering::SeqCst);
            });
            refused += usize::from(result.is_err());
        }
        fake().clear_faults();
        assert_eq!(refused, 10);
        assert_eq!(dropped.load(Ordering::SeqCst), 10, "the refused launches' owners");
        assert_eq!(context.pending_launches(), 20);
        fake()
            .poison_context(context.raw())
            .expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
        assert_eq!(unsafe { context.reset() }.unwrap(), 20);
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), 30, "every owner dropped once");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// Pending counts are per context, and a reclaim of one context leaves the other alone.
    fn pending_launches_are_counted_per_context_and_reclaimed_per_context(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let d = load_fake_driver();
        let primary = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let on_primary = Stream::new(&primary).unwrap();
        let mut device = 0;
        let (mut other, mut raw) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: valid out-pointers; a second context with a stream.
        unsafe {
            d.cuDeviceGet(&mut device, 0).unwrap();
            d.cuCtxCreate(&mut other, ptr::null_mut(), 0, device).unwrap();
            d.cuStreamCreate(&mut raw, 0).unwrap();
        }
        let [on_primary_hold, other_hold] = [on_primary.raw(), raw]
            .map(|s| fake().hold_stream(s).expect("the fake could not hold the stream"));
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // SAFETY: `raw` is live until its context is destroyed.
        let on_other = unsafe { RawStream::from_raw(raw) };
        launch_counted(&on_primary, &ran, &dropped);
        launch_counted(on_other, &ran, &dropped);
        assert_eq!(pending_launches(Some(primary.raw())), N);
        assert_eq!(pending_launches(Some(other)), N);
        assert_eq!(pending_launches(None), 2 * N);
        fake()
            .poison_context(other)
            .expect("the fake could not poison the context");
        other_hold.release();
        // SAFETY: the second context, destroyed once (poisoned: its host functions never run).
        unsafe { d.cuCtxDestroy(other) }.expect("destroying a poisoned context of our own");
        // SAFETY: destroyed; nothing launches into it.
        assert_eq!(unsafe { reclaim_pending(other) }, N, "pooled and boxed records reclaimed");
        assert_eq!(pending_launches(Some(primary.raw())), N);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        on_primary_hold.release();
        on_primary.synchronize().unwrap();
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), N, "the primary context's launches ran");
        assert_eq!(dropped.load(Ordering::SeqCst), 2 * OWNED);
        assert_eq!(pending_launches(None), 0);
    }
}
