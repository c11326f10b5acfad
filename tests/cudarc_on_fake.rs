//! An ordinary cudarc 0.19 program that launches no kernels runs on the fake driver unchanged:
//! contexts, streams, allocations, copies each way, sets, page-locked buffers, events, waits
//! between streams and synchronization, its data round-tripping; and loading a module fails with
//! a clear error instead of a panic.
//!
//! cudarc opens `libcuda.so` by name, so each test runs in a process of its own whose loader path
//! starts with a folder where `libcuda.so` is the fake (`fake_cuda::fixture::ChildTest`, what a
//! downstream crate would use).

use cudarc::driver::sys::{CUevent_flags, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, DriverError};
use fake_cuda::fixture::{ChildTest, LIVE_KINDS, LiveObjects};
use fake_cuda::steer::FakeCuda;

/// The program: what an application does with cudarc's safe API, without kernels.
fn program(fake: &FakeCuda) -> Result<(), DriverError> {
    let context = CudaContext::new(0)?;
    assert!(context.has_async_alloc(), "memory pools are supported");
    let stream = context.new_stream()?;
    let input: Vec<u32> = (0..1024).collect();

    // Host to device and back, and a set.
    let a = stream.clone_htod(&input)?;
    #[allow(deprecated)]
    let b: CudaSlice<u32> = stream.memcpy_stod(&input)?;
    let mut zeros = stream.alloc_zeros::<u32>(1024)?;
    assert_eq!(stream.clone_dtoh(&zeros)?, vec![0; 1024]);
    #[allow(deprecated)]
    let b_back = stream.memcpy_dtov(&b)?;
    assert_eq!(b_back, input);

    // Device to device, then a set.
    stream.memcpy_dtod(&a, &mut zeros)?;
    let copy = stream.clone_dtod(&b)?;
    assert_eq!(stream.clone_dtoh(&zeros)?, input);
    assert_eq!(stream.clone_dtoh(&copy)?, input);
    stream.memset_zeros(&mut zeros)?;
    assert_eq!(stream.clone_dtoh(&zeros)?, vec![0; 1024]);

    // Page-locked host buffers, both ways.
    // SAFETY: written before it is read.
    let mut pinned = unsafe { context.alloc_pinned::<u32>(1024) }?;
    pinned.as_mut_slice()?.copy_from_slice(&input);
    let from_pinned = stream.clone_htod(&pinned)?;
    // SAFETY: written by the copy before it is read.
    let mut back = unsafe { context.alloc_pinned::<u32>(1024) }?;
    stream.memcpy_dtoh(&from_pinned, &mut back)?;
    assert_eq!(back.as_slice()?, &input[..]);

    // Events, and work on a second stream joined back.
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let other = stream.fork()?;
    let mut doubled = other.alloc_zeros::<u32>(1024)?;
    let twice: Vec<u32> = input.iter().map(|x| x * 2).collect();
    other.memcpy_htod(&twice, &mut doubled)?;
    stream.join(&other)?;
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    end.synchronize()?;
    assert!(start.elapsed_ms(&end)? >= 0.0);
    assert!(end.is_complete());
    assert_eq!(stream.clone_dtoh(&doubled)?, twice);

    // The default stream.
    let default = context.default_stream();
    let on_default = default.clone_htod(&input)?;
    assert_eq!(default.clone_dtoh(&on_default)?, input);

    let (free, total) = context.mem_get_info()?;
    assert!(
        free < total,
        "{free} of {total} free with buffers allocated"
    );
    assert!(fake.live_objects("device_allocations") >= 7);

    drop((
        a,
        b,
        zeros,
        copy,
        from_pinned,
        doubled,
        on_default,
        pinned,
        back,
    ));
    drop((start, end, other, default));
    stream.synchronize()?;
    drop(stream);
    context.synchronize()?;
    context.check_err()?;
    // Everything cudarc made, it gave back (the context's retain aside).
    let live = LiveObjects::of(fake);
    for kind in LIVE_KINDS.iter().filter(|k| **k != "primary_retains") {
        assert_eq!(live.get(kind), 0, "{kind} left: {live}");
    }
    Ok(())
}

#[test]
fn a_cudarc_program_without_kernels_runs_on_the_fake() {
    ChildTest::new("a_cudarc_program_without_kernels_runs_on_the_fake").run(|| {
        let fake = FakeCuda::locate_and_open().expect("the fake's control functions");
        program(&fake).expect("the cudarc program");
        assert_eq!(
            fake.call_count("cuModuleLoadData"),
            0,
            "the program loads no module"
        );
        assert!(fake.call_count("cuMemcpyHtoDAsync_v2") > 0);
        assert!(fake.call_count("cuMemAllocAsync") > 0);
    });
}

#[test]
fn loading_a_module_with_cudarc_fails_with_not_supported() {
    ChildTest::new("loading_a_module_with_cudarc_fails_with_not_supported").run(|| {
        let context = CudaContext::new(0).unwrap();
        let ptx = cudarc::nvrtc::Ptx::from_src(cuda_workspace::gpu::TEST_KERNELS_PTX);
        let error = context
            .load_module(ptx)
            .expect_err("the fake runs no kernels");
        assert_eq!(error.0, CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert!(error.to_string().contains("not supported"), "{error}");
        context.check_err().unwrap();
    });
}
