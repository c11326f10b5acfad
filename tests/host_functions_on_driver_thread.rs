//! A smoke test through the table: a context, streams and `cuLaunchHostFunc`. The fake runs host
//! functions as the real driver does, on one driver-owned thread per context, never the caller's.

use std::ffi::c_void;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::{CUdevice, CUstream};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{current_primary_context, fake, load_fake_driver, os_thread};

/// What a host function saw.
#[derive(Default)]
struct Witness {
    runs: AtomicUsize,
    /// (id, name) of each thread that ran one, as the OS knows them.
    threads: Mutex<Vec<(String, String)>>,
}

unsafe extern "C" fn record(data: *mut c_void) {
    // SAFETY: every launch passes a pointer to a `Witness` that outlives the synchronize after it.
    let witness = unsafe { &*data.cast::<Witness>() };
    witness
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(os_thread());
    witness.runs.fetch_add(1, Ordering::SeqCst);
}

isolated_test! {
    /// Host functions on two streams all run, on the same driver thread, which is not the
    /// caller's; releasing the primary context ends that thread.
    fn host_functions_run_on_the_contexts_driver_thread() {
        let driver = load_fake_driver();
        let context = current_primary_context(driver);
        let witness = Witness::default();
        let data = ptr::from_ref(&witness).cast_mut().cast::<c_void>();
        let mut streams: [CUstream; 2] = [ptr::null_mut(); 2];
        // SAFETY: valid out-pointers; `witness` outlives every synchronize below.
        unsafe {
            for stream in &mut streams {
                driver.cuStreamCreate(stream, 0).unwrap();
            }
            for i in 0..6 {
                driver.cuLaunchHostFunc(streams[i % 2], Some(record), data).unwrap();
            }
            for stream in streams {
                driver.cuStreamSynchronize(stream).unwrap();
                driver.cuStreamDestroy(stream).unwrap();
            }
        }
        assert_eq!(witness.runs.load(Ordering::SeqCst), 6);
        let threads = witness.threads.lock().unwrap().clone();
        let (first, name) = &threads[0];
        assert_ne!(*first, os_thread().0, "ran on the caller's thread");
        assert!(name.starts_with("fake-cuda-drive"), "{name:?}");
        assert!(threads.iter().all(|(id, _)| id == first), "{threads:?}");
        assert_eq!(fake().driver_thread_count(), 1);
        assert_eq!(fake().pending_host_functions(context), 0);

        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer; the context was retained once above.
        unsafe {
            driver.cuCtxGetDevice(&mut device).unwrap();
            driver.cuDevicePrimaryCtxRelease(device).unwrap();
        }
        assert_eq!(fake().driver_thread_count(), 0);
    }
}
