//! `fake_cuda::fixture` and the leak-check counts of memory: what the fake guarantees its users
//! beyond the real driver (so not in the conformance suite).

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cuda_dl_sys::DefaultStream;
use cuda_dl_sys::types::{CUcontext, CUdeviceptr, CUresult, CUstream};
use fake_cuda::fixture;

fn code(result: Result<(), impl Into<cuda_dl_sys::Error>>) -> Option<CUresult> {
    result.err().and_then(|e| e.into().code())
}

fn new_stream(driver: &cuda_dl_sys::Driver) -> CUstream {
    let mut stream = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0) }.unwrap();
    stream
}

static HOOK_RUNS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn the_guard_puts_the_steering_back_when_it_drops() {
    let version = |driver: &cuda_dl_sys::Driver| {
        let mut version = 0;
        // SAFETY: a valid out-pointer.
        unsafe { driver.cuDriverGetVersion(&mut version) }.unwrap();
        version
    };
    let (stream, at_load) = {
        let fake = fixture::lock();
        let driver = fake.driver();
        fake.primary_context().unwrap();
        let at_load = version(driver);
        let stream = new_stream(driver);
        fake.set_version(11080);
        fake.set_fault("cuStreamCreate", 0, CUresult::CUDA_ERROR_OUT_OF_MEMORY.0);
        fake.set_missing(&["cuMemAllocAsync"]);
        fake.set_hook("cuStreamQuery", 0, || {
            HOOK_RUNS.fetch_add(1, Ordering::SeqCst);
        });
        fake.hold_stream(stream)
            .expect("a live stream")
            .into_token();
        fake.focus_calls_on_this_thread(true);
        assert_eq!(version(driver), 11080);
        (stream, at_load)
    };
    let fake = fixture::lock();
    let driver = fake.driver();
    fake.primary_context().unwrap();
    assert_eq!(version(driver), at_load, "the version");
    new_stream(driver);
    driver
        .get_proc_address("cuMemAllocAsync", 11020, DefaultStream::Legacy)
        .expect("cuMemAllocAsync is no longer missing");
    // SAFETY: a live stream; its hold was released by the reset, so it finishes.
    unsafe {
        driver.cuStreamSynchronize(stream).unwrap();
        driver.cuStreamQuery(stream).unwrap();
    }
    assert_eq!(HOOK_RUNS.load(Ordering::SeqCst), 0, "the hook ran");
    std::thread::scope(|scope| {
        scope.spawn(|| version(driver));
    });
    assert!(
        fake.call_count("cuDriverGetVersion") >= 2,
        "another thread's calls are not counted"
    );
}

#[test]
fn tests_that_lock_the_fake_take_turns() {
    static INSIDE: AtomicBool = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..5 {
                    let _fake = fixture::lock();
                    assert!(
                        !INSIDE.swap(true, Ordering::SeqCst),
                        "two tests hold the fake"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    INSIDE.store(false, Ordering::SeqCst);
                }
            });
        }
    });
}

#[test]
fn a_test_without_the_turn_loads_the_fake_as_the_process_driver() {
    // In a process of its own, so that no test that took the turn loaded the fake before it.
    fixture::ChildTest::new("a_test_without_the_turn_loads_the_fake_as_the_process_driver").run(
        || {
            let driver = fixture::driver();
            let mut context: CUcontext = ptr::null_mut();
            // SAFETY: valid out-pointers; the context is device 0's primary, released below.
            unsafe {
                driver.cuDevicePrimaryCtxRetain(&mut context, 0).unwrap();
                driver.cuCtxSetCurrent(context).unwrap();
            }
            let stream = new_stream(driver);
            // SAFETY: the stream made above, destroyed once; the retain taken above.
            unsafe {
                driver.cuStreamDestroy(stream).unwrap();
                driver.cuDevicePrimaryCtxRelease(0).unwrap();
            }
            let process_driver = cuda_dl_sys::driver().expect("the fixture loaded it");
            assert!(
                ptr::eq(driver, process_driver),
                "cuda_dl_sys::driver() is the fake the fixture loaded"
            );
            // The turn is still free: taking it does not load a second time.
            assert!(ptr::eq(fixture::lock().driver(), driver));
        },
    );
}

#[test]
fn the_call_counters_start_at_zero_for_each_test() {
    let fake = fixture::lock();
    assert_eq!(fake.call_counts().into_values().sum::<u64>(), 0);
    fake.primary_context().unwrap();
    assert!(fake.call_count("cuCtxSetCurrent") >= 1);
}

#[test]
fn live_objects_count_allocations_until_they_are_freed() {
    let fake = fixture::lock();
    let driver = fake.driver();
    fake.primary_context().unwrap();
    let before = fake.live_objects_now();
    let stream = new_stream(driver);
    let (mut device, mut stream_ordered): (CUdeviceptr, CUdeviceptr) = (0, 0);
    let mut host = ptr::null_mut();
    let hold = fake.hold_stream(stream).expect("a live stream");
    // SAFETY: valid out-pointers; each allocation is freed once, below.
    unsafe {
        driver.cuMemAlloc(&mut device, 256).unwrap();
        driver.cuMemHostAlloc(&mut host, 256, 0).unwrap();
        driver
            .cuMemAllocAsync(&mut stream_ordered, 256, stream)
            .unwrap();
        driver.cuMemFreeAsync(stream_ordered, stream).unwrap();
    }
    let during = fake.live_objects_now();
    assert_eq!(
        during.get("device_allocations"),
        before.get("device_allocations") + 2,
        "the stream has not got to the free: {during}"
    );
    assert_eq!(
        during.get("host_allocations"),
        before.get("host_allocations") + 1
    );
    hold.release();
    // SAFETY: live handles; memory allocated above.
    unsafe {
        driver.cuStreamSynchronize(stream).unwrap();
        assert_eq!(
            fake.live_objects("device_allocations"),
            before.get("device_allocations") + 1
        );
        driver.cuMemFree(device).unwrap();
        driver.cuMemFreeHost(host).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
    }
    let after = fake.live_objects_now();
    assert_eq!(after.grown_since(&before), [], "{after}");
}

#[test]
fn a_destroyed_contexts_memory_is_no_longer_counted() {
    let fake = fixture::lock();
    let driver = fake.driver();
    let before = fake.live_objects_now();
    let mut context: CUcontext = ptr::null_mut();
    let mut device: CUdeviceptr = 0;
    let mut host = ptr::null_mut();
    // SAFETY: valid out-pointers; the context is made and destroyed here.
    unsafe {
        driver
            .cuCtxCreate(&mut context, ptr::null_mut(), 0, 0)
            .unwrap();
        driver.cuMemAlloc(&mut device, 256).unwrap();
        driver.cuMemHostAlloc(&mut host, 256, 0).unwrap();
        assert_eq!(
            fake.live_objects("device_allocations"),
            before.get("device_allocations") + 1
        );
        driver.cuCtxDestroy(context).unwrap();
    }
    let after = fake.live_objects_now();
    assert_eq!(after.grown_since(&before), [], "{after}");
}

#[test]
fn memory_freed_while_a_queued_copy_uses_it_goes_once_the_copy_ran() {
    let fake = fixture::lock();
    let driver = fake.driver();
    fake.primary_context().unwrap();
    let stream = new_stream(driver);
    let (mut source, mut target): (CUdeviceptr, CUdeviceptr) = (0, 0);
    // SAFETY: valid out-pointers; 64 bytes each.
    unsafe {
        driver.cuMemAlloc(&mut source, 64).unwrap();
        driver.cuMemAlloc(&mut target, 64).unwrap();
        driver.cuMemsetD8(source, 0x3c, 64).unwrap();
    }
    let before = fake.live_objects("device_allocations");
    let hold = fake.hold_stream(stream).expect("a live stream");
    let mut output = [0u8; 64];
    // SAFETY: live handles; the source is freed while the copy waits.
    unsafe {
        driver
            .cuMemcpyDtoDAsync(target, source, 64, stream)
            .unwrap();
        driver.cuMemFree(source).unwrap();
        assert_eq!(
            code(driver.cuMemFree(source)),
            Some(CUresult::CUDA_ERROR_INVALID_VALUE),
            "freed memory is unknown at once"
        );
        assert_eq!(
            fake.live_objects("device_allocations"),
            before,
            "kept for the copy"
        );
        hold.release();
        driver.cuStreamSynchronize(stream).unwrap();
        assert_eq!(fake.live_objects("device_allocations"), before - 1);
        driver
            .cuMemcpyDtoH(output.as_mut_ptr().cast(), target, 64)
            .unwrap();
        driver.cuMemFree(target).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
    }
    assert_eq!(output, [0x3c; 64]);
}

#[test]
fn a_copy_from_memory_unregistered_before_the_stream_got_there_is_a_sticky_error() {
    let fake = fixture::lock();
    let driver = fake.driver();
    let mut context: CUcontext = ptr::null_mut();
    let mut target: CUdeviceptr = 0;
    let mut source = vec![1u8; 64];
    // SAFETY: valid out-pointers; a context of this test's own, destroyed at the end.
    unsafe {
        driver
            .cuCtxCreate(&mut context, ptr::null_mut(), 0, 0)
            .unwrap();
        driver.cuMemAlloc(&mut target, 64).unwrap();
        driver
            .cuMemHostRegister(source.as_mut_ptr().cast(), 64, 0)
            .unwrap();
    }
    let stream = new_stream(driver);
    let hold = fake.hold_stream(stream).expect("a live stream");
    // SAFETY: live handles; the source is unregistered while the copy waits (the fault under
    // test), and lives on.
    unsafe {
        driver
            .cuMemcpyHtoDAsync(target, source.as_ptr().cast(), 64, stream)
            .unwrap();
        driver
            .cuMemHostUnregister(source.as_mut_ptr().cast())
            .unwrap();
        hold.release();
        assert_eq!(
            code(driver.cuStreamSynchronize(stream)),
            Some(CUresult::CUDA_ERROR_LAUNCH_FAILED)
        );
        driver.cuCtxDestroy(context).unwrap();
    }
}

#[test]
fn the_folder_command_puts_the_fake_in_front_of_a_program_that_opens_libcuda_by_name() {
    let test = "the_folder_command_puts_the_fake_in_front_of_a_program_that_opens_libcuda_by_name";
    let child = fixture::ChildTest::new(test);
    let folder = if child.is_child() {
        std::path::PathBuf::new() // the parent made it and put it on LD_LIBRARY_PATH
    } else {
        let wanted = std::env::temp_dir().join(format!("fake-libcuda-test-{}", std::process::id()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fake-libcuda-folder"))
            .arg(&wanted)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8(out.stdout).unwrap();
        let folder = std::path::PathBuf::from(printed.trim_end());
        assert_eq!(
            folder,
            wanted.canonicalize().unwrap(),
            "it prints the folder"
        );
        for name in ["libcuda.so.1", "libcuda.so"] {
            let linked = folder.join(name).canonicalize().unwrap();
            assert_eq!(
                linked.file_name().unwrap(),
                "libfake_cuda.so",
                "{name} is the fake"
            );
        }
        folder
    };
    // A program started with the folder first on its loader path (what the README's shell line
    // does) opens the fake by either name.
    child.env("LD_LIBRARY_PATH", &folder).run(|| {
        for name in ["libcuda.so.1", "libcuda.so"] {
            // SAFETY: the library found first on LD_LIBRARY_PATH, the fake; kept loaded for the
            // process, as bindings keep the driver.
            let library = unsafe { libloading::Library::new(name) }.expect(name);
            // SAFETY: only looked up, not called.
            let control = unsafe { library.get::<extern "C" fn()>(b"fake_cuda_reset_steering\0") };
            assert!(control.is_ok(), "{name} is not the fake");
            std::mem::forget(library);
        }
    });
    if !folder.as_os_str().is_empty() {
        let _ = std::fs::remove_dir_all(&folder);
    }
}
