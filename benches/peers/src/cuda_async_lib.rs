//! NVIDIA's cuda-async 0.5 (and cuda-core 0.5 under it): a `DeviceFuture` of a no-op operation
//! scheduled on one of our streams, borrowed into a `cuda_core::Stream`, and cuda-core's
//! `Stream::launch_host_function`. Their bindings (cuda-bindings) open `libcuda.so.1` themselves
//! at first use; in one process that is the library our crates opened, so the context and
//! streams are the same objects.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_async::device_operation::{DeviceOp, value};
use cuda_async::scheduling_policies::SingleStream;
use cuda_host_launch::Stream;

use crate::gpu::Gpu;
use crate::wake::BoxFuture;

/// cuda-async's reactor thread (`cuda-async-reactor`, cut to 15 characters as `comm` shows it).
pub const THREADS: &[&str] = &["cuda-async-reac"];

/// cuda-core's view of our primary context (borrowed: cuda-core never releases it).
pub struct NvidiaContext {
    context: Arc<cuda_core::Context>,
}

impl NvidiaContext {
    /// Borrows the primary context, after checking that cuda-bindings could open the driver
    /// (its calls would otherwise answer `CUDA_ERROR_NOT_INITIALIZED` at every use).
    pub fn borrow(gpu: &Gpu) -> Result<NvidiaContext, String> {
        if let Some(error) = cuda_core::sys::cuda_driver_load_error() {
            return Err(format!("cuda-bindings could not open the driver: {error}"));
        }
        // SAFETY: the primary context of device 0, retained by `gpu` for the whole run (this
        // value is dropped before it); cuda-core's borrowed context never releases it.
        let context = unsafe {
            cuda_core::Context::borrow_raw(gpu.context.raw().cast::<c_void>(), gpu.device.raw(), 0)
        };
        context
            .bind_to_thread()
            .map_err(|e| format!("cuda-core bind_to_thread: {e}"))?;
        Ok(NvidiaContext { context })
    }

    /// Makes the context current on the calling thread, as cuda-async's reactor needs at its
    /// first registration (it allocates its flag slab with `cuMemHostAlloc`).
    pub fn bind(&self) -> Result<(), String> {
        self.context
            .bind_to_thread()
            .map_err(|e| format!("cuda-core bind_to_thread: {e}"))
    }

    /// cuda-core's view of one of our streams; holds it alive.
    pub fn stream(&self, stream: &Arc<Stream>) -> Arc<cuda_core::Stream> {
        // SAFETY: `stream` is a live stream of this context; the `Arc` handed over as owner keeps
        // it alive as long as the borrowed wrapper lives.
        unsafe {
            cuda_core::Stream::borrow_with_owner(
                stream.raw().cast::<c_void>(),
                &self.context,
                Arc::clone(stream) as Arc<dyn cuda_core::ForeignOwner>,
            )
        }
    }
}

/// A cuda-async future of a no-op operation on `stream`: on its first poll it spins on
/// `cuStreamQuery` (`CUDA_ASYNC_SPIN_BUDGET_US`, 20 µs by default), then registers with the
/// reactor (a `cuStreamWriteValue32` into a pinned slot that its thread scans).
pub fn future(stream: &Arc<cuda_core::Stream>) -> Result<BoxFuture, String> {
    let future = value(())
        .schedule(&SingleStream::from_stream(Arc::clone(stream)))
        .map_err(|e| format!("cuda-async schedule: {e}"))?;
    Ok(Box::pin(async move {
        future.await.map_err(|e| format!("cuda-async future: {e}"))
    }))
}

/// Enqueues `n` no-op closures with cuda-core's `Stream::launch_host_function`.
pub fn host_function_noops(stream: &cuda_core::Stream, n: usize) -> Result<(), String> {
    for _ in 0..n {
        stream
            .launch_host_function(|| {})
            .map_err(|e| format!("cuda-core launch_host_function: {e}"))?;
    }
    Ok(())
}
