//! A fake NVIDIA CUDA driver: a `cdylib` that exports the part of the driver API that host-side
//! code uses, for tests on machines without a GPU.
//!
//! Tests load it like the real driver, through `unsafe { cuda_dl_sys::Driver::load(
//! LoadOptions::with_library_path(path)) }` or `CUDA_DL_SYS_LIBRARY=<path>` (or, for a binding that
//! opens `libcuda.so` or `libcuda.so.1` by name, a folder with those links first on
//! `LD_LIBRARY_PATH` of a child process: see [`steer::libcuda_folder`] and
//! [`fixture::ChildTest`]), and steer or inspect it through [`steer::FakeCuda`], the typed Rust
//! API over the exported `fake_cuda_*` functions (see [`control`]), which it reaches by opening
//! the same library again (the system loader hands back the already loaded copy). The crate is
//! both the driver (`cdylib`) and, for tests, that API (`rlib`). [`fixture`] is the set-up for
//! another crate's tests: the fake loaded once per process, one test at a time steering it (its
//! settings are **process-wide**), its steering reset after each; `README.md` shows how to depend
//! on it and where the library is, `tests/downstream.rs` is an example.
//!
//! # Configuration
//!
//! Read once, on first use, from the environment; most of it can be changed later through the
//! control functions.
//!
//! | variable | effect |
//! | --- | --- |
//! | `FAKE_CUDA_VERSION` | the version `cuDriverGetVersion` reports (default 13000) |
//! | `FAKE_CUDA_STUB=1` | behave like the toolkit's stub `libcuda.so`: every call returns 34 |
//! | `FAKE_CUDA_MISSING=cuFoo,cuBar` | base symbols `cuGetProcAddress` claims not to know |
//! | `FAKE_CUDA_FAIL=name[@n][=code],...` | fault injection (see [`control::fake_cuda_set_fault`]) |
//! | `FAKE_CUDA_DEVICES` | number of devices (default 1) |
//!
//! `FAKE_CUDA_MISSING` only hides symbols from `cuGetProcAddress`/`cuGetProcAddress_v2`: every
//! function is still exported, because the fake cannot change what `dlsym` finds. Drivers older
//! than 11.3 (resolved by export name) therefore never miss anything.
//!
//! # What it models
//!
//! - `cuGetProcAddress_v2` and `cuGetProcAddress` (v1) over a table of every implemented function
//!   and its versioned variants, with per-thread default-stream twins (`_ptsz`/`_ptds`), version
//!   gating and the real status and error codes; every variant is also exported under its real
//!   export name, as drivers older than 11.3 are resolved by export.
//! - Devices, primary contexts (refcounted, one handle per device), created contexts and the
//!   thread-local current-context stack. Handles are heap addresses that are never reused, and
//!   every handle is checked against a registry: a stale one is reported (201 for contexts, 400
//!   otherwise), never dereferenced.
//! - **One driver-owned thread per context** (`fake-cuda-driver-<n>`), started at the context's first
//!   enqueued operation, that runs every stream-ordered operation of that context: host functions,
//!   stream callbacks, event records and waits, value writes and waits (`cuStreamWriteValue32/64`,
//!   `cuStreamWaitValue32/64` on mapped host memory, with the four wait conditions), copies,
//!   sets and stream-ordered frees, graph launches, and "holds" (the stand-in for a long-running kernel, see
//!   [`control::fake_cuda_hold_stream`]; a `cuStreamWaitValue32` on a word the test writes later
//!   is the same on both drivers). Each stream is a
//!   FIFO; the thread runs the first runnable head of any stream of its context, round robin.
//! - `cuStreamDestroy` returns at once and the stream's pending work still runs; destroying a
//!   context (or the last release/reset of a primary one) first runs all its pending work, then
//!   joins its thread.
//! - Sticky errors ([`control::fake_cuda_poison_context`]): pending and later host functions of the
//!   context never run, synchronize/query calls return 719, and `cuLaunchHostFunc` (any enqueue)
//!   returns 0 until one of them has reported the error, 719 after (as on the H200's driver).
//! - Events: record, query, synchronize, `cuEventElapsedTime` (host time between the driver thread
//!   completing the two records; `CU_EVENT_DISABLE_TIMING` honoured), and an event recorded in a
//!   capture is a marker: querying it gives `CUDA_ERROR_CAPTURED_EVENT` and invalidates the
//!   capture, after the capture `CUDA_ERROR_INVALID_VALUE` (measured: `probes/event_facts.c`).
//! - Stream capture into graphs (host functions become host nodes, value writes memory-operation
//!   nodes, `Async` copies and sets memcpy and memset nodes, events fork other streams into a
//!   capture, `cuStreamAddCallback` invalidates it), graphs, instantiation (with the flags the
//!   driver accepts) and replay, and user
//!   objects whose destructors run on a fake-internal thread once the last reference (including an
//!   in-flight launch's) is gone.
//! - Capture-interaction modes (`capture_mode.rs`): per-thread modes
//!   (`cuThreadExchangeStreamCaptureMode`, `GLOBAL` by default) and the captures' modes decide
//!   whether a potentially unsafe call (`cuMemAlloc`, `cuMemFree`, `cuEventQuery`,
//!   `cuStreamSynchronize`, ...) fails with 900 and invalidates the captures that prohibit it, as
//!   measured on the real driver.
//! - The driver's teardown at process exit (`teardown.rs`): an exit handler registered at the
//!   first `cuInit`; every call after it returns 4 (`CUDA_ERROR_DEINITIALIZED`) and is counted
//!   ([`control::fake_cuda_calls_after_teardown`]).
//! - Calls made on the fake's own threads (a context's worker, inside a host function, or the
//!   user-object destructor thread), where the real driver forbids CUDA calls, are also counted
//!   apart ([`control::fake_cuda_driver_thread_call_count`]), so tests can check nobody makes them.
//! - Calls that name an event the fake does not know (destroyed, also with its context by a
//!   destroy, last release or reset) are counted ([`control::fake_cuda_unknown_event_calls`]): on
//!   the real driver such a handle may name another event made since.
//! - Hooks ([`control::fake_cuda_set_hook`], [`control::fake_cuda_set_hook_after`]): a test's
//!   function run at the start or the end of a chosen call, on the calling thread, to make
//!   something happen exactly between two driver calls of the code under test (another thread's
//!   capture beginning inside a launch, a reclaim during one).
//! - Introspection for tests: every call counter at once ([`control::fake_cuda_call_counts`], to
//!   learn which functions an operation calls), live objects per kind
//!   ([`control::fake_cuda_live_objects`], for leak checks) and the calling thread's
//!   current-context stack depth ([`control::fake_cuda_context_stack_depth`]).
//! - Memory (`memory.rs`, `memory_op.rs`, `copies.rs`, `memset.rs`, `stream_alloc.rs`): device
//!   memory (`cuMemAlloc`), stream-ordered device memory (`cuMemAllocAsync`; `cuMemFreeAsync`
//!   frees it when the stream gets there) and page-locked host memory (`cuMemHostAlloc`,
//!   `cuMemAllocHost`) are zeroed host memory, and a device pointer is the host address (unified
//!   addressing); each allocation belongs to its context and goes with it; `cuMemGetInfo` counts
//!   device allocations against `cuDeviceTotalMem`'s 16 GiB (beyond: out of memory). Host memory
//!   registered with `cuMemHostRegister` belongs to the context current at the registration and is
//!   dropped with it (destroyed, or a primary context's last release or reset). Copies (host to
//!   device, device to host, device to device, `cuMemcpy` by address, `cuMemcpyPeer`) and sets
//!   (`cuMemsetD8/D16/D32`), synchronous and `Async`, are operations of a stream (the default
//!   stream, legacy or per-thread, for the synchronous ones) that the context's driver thread
//!   runs in order, each call returning when the Driver API's "API synchronization behavior" says;
//!   a copy from pageable memory that returns at once takes the source at the call. Memory freed
//!   while queued copies or sets use it lasts until they have run; a `cuMemHostRegister` range
//!   unregistered before then makes a sticky error (the device's illegal-address fault). The
//!   device reports `CAN_MAP_HOST_MEMORY`, `UNIFIED_ADDRESSING` and `MEMORY_POOLS_SUPPORTED`.
//!
//! # The proof: the conformance suite
//!
//! `tests/driver_conformance.rs` in the workspace states each of these behaviours as a case written
//! once against the driver API through `cuda-dl-sys`; `cargo test` runs it against the fake, the GPU
//! bundle (`scripts/gpu-bundle`) against the real driver. Where the real driver differs, the case
//! is listed with its reason in `tests/conformance/differences.txt`, and the suite checks that
//! the listed cases still differ there.
//!
//! # What it simplifies
//!
//! - No kernels: every module and library load (`cuModuleLoad`, `cuModuleLoadData(Ex)`,
//!   `cuModuleLoadFatBinary`, `cuLibraryLoadData`, `cuLibraryLoadFromFile`) returns 801
//!   (`CUDA_ERROR_NOT_SUPPORTED`), kernel graph nodes are empty nodes.
//! - Only part of the driver API: the functions the workspace and everyday bindings use, and
//!   their kin (about 110); `cuGetProcAddress` says "not found" for the rest, which are not
//!   exported either.
//! - `cuGetErrorString` gives the real driver's text for the codes the fake returns, the pinned
//!   header's documentation for the others.
//! - The legacy default stream's implicit synchronization with other blocking streams is not
//!   modelled (a synchronous copy waits for the default stream's own work only).
//! - Memory: no arrays, pitched, 2D/3D, managed or virtual-memory calls, no memory pools beyond
//!   the default one; `cuMemFree` returns at once (the real driver may first wait for the
//!   device), the memory going once queued work that uses it has run;
//!   in a capture, `Async` copies and sets between memory the device reaches become memcpy and
//!   memset nodes (as on the real driver), but synchronous ones, copies to or from pageable
//!   memory and the stream-ordered allocator return 900 and invalidate it; page-locked memory of a destroyed
//!   context leaves the registry but is never unmapped, so a stray host access does not crash.
//! - Capture: no check that forked streams rejoin before `cuStreamEndCapture`, no graph launches,
//!   holds or value waits inside a capture (900, invalidating it), and a wait on an event recorded
//!   outside the capture fails with 905.
//! - A host function may call back into the fake (enqueue work, use the control functions), but
//!   synchronizing its own context from its driver thread returns 800 (`CUDA_ERROR_NOT_PERMITTED`)
//!   instead of deadlocking.
//! - Everything of a context progresses on its one thread; a hold blocks only its own stream.
//! - `cuDevicePrimaryCtxReset` runs pending work and gives the context fresh state but keeps its
//!   retain count; the primary context's handle never changes.
//!
//! Like the real driver, calls other than `cuInit`, `cuDriverGetVersion`, `cuGetErrorName`,
//! `cuGetErrorString` and `cuGetProcAddress*` return 3 before `cuInit`, and `cuUserObjectCreate`
//! requires `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
//!
//! The fake has its own copy of the Rust standard library, so its threads are unknown to the
//! caller's `std::thread::current()` (no name, a fresh id), like the real driver's C threads; the
//! operating system knows them as `fake-cuda-drive` (the name cut to 15 bytes) and
//! `fake-cuda-user-` (the user-object destructor thread).

#![allow(clippy::missing_safety_doc, non_snake_case)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

/// Exports `$name`, a variant of the base symbol `$base`, whose body is the `unsafe fn $imp` of the
/// same parameters returning `Result<(), CUresult>`.
macro_rules! export {
    ($base:literal, $name:ident => $imp:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> cuda_dl_sys::types::CUresult {
            $crate::calls::call(stringify!($name), $base, || {
                // SAFETY: the C caller upholds this function's contract in the CUDA Driver API
                // reference (valid pointers for what it reads and writes), which is all that the
                // implementation relies on.
                $crate::errors::code(unsafe { $imp($($arg),*) })
            })
        }
    };
}

/// Exports a stream-ordered function twice: `$name`, where the stream handle 0 means the legacy
/// default stream, and its per-thread default-stream twin `$per_thread` (`_ptsz`/`_ptds`), where 0
/// means the calling thread's default stream. `$imp` takes the parameters and then that choice.
macro_rules! stream_export {
    ($base:literal, $name:ident / $per_thread:ident => $imp:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> cuda_dl_sys::types::CUresult {
            $crate::calls::call(stringify!($name), $base, || {
                // SAFETY: as for `export!`: the C caller upholds the function's contract.
                $crate::errors::code(unsafe { $imp($($arg,)* false) })
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $per_thread($($arg: $ty),*) -> cuda_dl_sys::types::CUresult {
            $crate::calls::call(stringify!($per_thread), $base, || {
                // SAFETY: as for `export!`: the C caller upholds the function's contract.
                $crate::errors::code(unsafe { $imp($($arg,)* true) })
            })
        }
    };
}

mod calls;
mod capture;
mod capture_mode;
mod config;
mod context;
pub mod control;
mod copies;
mod device;
mod errors;
mod event;
pub mod fixture;
mod graph;
mod hooks;
mod memory;
mod memory_op;
mod memset;
mod module;
mod oracle;
mod proc_address;
mod reset;
mod scheduler;
mod state;
pub mod steer;
mod stream;
mod stream_alloc;
mod teardown;
mod user_object;
