//! The NVIDIA CUDA driver API, loaded at run time.
//!
//! - **No link-time dependency.** The driver library (`libcuda.so.1`, then `libcuda.so`;
//!   `nvcuda.dll` from the Windows system folder; or the path in `CUDA_DL_SYS_LIBRARY`, which the
//!   process then trusts to be the driver: see [`driver`]'s Safety section) is opened on first use,
//!   once per process, and never unloaded. [`Driver::load`] opens a path of the caller's choosing
//!   and [`Driver::adopt`] takes a library the caller opened: both are `unsafe` for that reason;
//!   [`Driver::load_default`] is the safe standard search. This crate builds with no CUDA toolkit
//!   and no GPU.
//! - **Every function of `cuda.h`, and every older ABI variant, in one declarative table.** Each
//!   entry carries the ABI version its signature binds (`cuLaunchHostFunc` 10.0,
//!   `cuStreamGetCaptureInfo` 12.3, `cuStreamGetCaptureInfo_v2` 11.3, `cuCtxCreate_v2` 3.2, ...),
//!   derived from `cudaTypedefs.h` by the generator, not by hand. The [`functions`] module is the
//!   index: one typed entry per function, and [`Driver::newest_variant`] picks the newest variant
//!   a driver has, as a [`ChosenFunction`] whose checked call's error names the variant picked.
//! - **Lazy, per-function, version-gated resolution.** The first call of a function resolves it
//!   through `cuGetProcAddress_v2` (or the older ways on older drivers) and caches the pointer; later
//!   calls cost one atomic load and a branch. A function newer than the driver returns
//!   [`Error::DriverTooOld`] without calling anything; one the driver lacks returns
//!   [`Error::SymbolMissing`]; neither affects any other function. Nothing here panics.
//!
//! Two levels:
//! - `driver()?.cuStreamSynchronize(stream)`: `unsafe`, returns `Result<(), CallError>`, 12 bytes
//!   and `Copy`, which `?` or [`Error::from`] turns into the rich [`Error`] with the driver's own
//!   name and description of a failing code;
//! - `driver()?.raw().cuStreamSynchronize()?`: the C function pointer with its exact signature.
//!
//! [`driver`] initialises the driver itself: its first call opens the library and calls
//! `cuInit(0)` (then `cuDriverGetVersion`), so there is no `cuInit` to call first; a failing
//! `cuInit` is that call's [`Error::Driver`]. (Calling `cuInit` again is harmless.)
//!
//! ```
//! use cuda_dl_sys::{driver, types::*};
//!
//! # fn main() -> Result<(), cuda_dl_sys::Error> {
//! # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the workspace's fake
//! let cuda = driver()?; // opens the library and calls cuInit(0)
//! println!("CUDA {} ({:?})", cuda.version(), cuda.resolution_path());
//! let mut device: CUdevice = 0;
//! let mut context: CUcontext = std::ptr::null_mut();
//! let mut stream: CUstream = std::ptr::null_mut();
//! // SAFETY: every out-pointer is a valid local; the handles come from the driver.
//! unsafe {
//!     cuda.cuDeviceGet(&mut device, 0)?;
//!     cuda.cuDevicePrimaryCtxRetain(&mut context, device)?;
//!     cuda.cuCtxSetCurrent(context)?;
//!     cuda.cuStreamCreate(&mut stream, 0)?;
//!     cuda.cuStreamSynchronize(stream)?;
//!     cuda.cuStreamDestroy(stream)?;
//!     cuda.cuDevicePrimaryCtxRelease(device)?;
//! }
//! # Ok(()) }
//! ```
//!
//! **Is a function available?** Resolve it: [`Driver::resolve`] (or the typed
//! `driver.raw().cuFoo()`) answers without calling it, and caches the answer. Only the function
//! is concerned: a driver too old for one still runs every other.
//!
//! ```
//! use cuda_dl_sys::{Error, Function, driver};
//!
//! # fn main() -> Result<(), cuda_dl_sys::Error> {
//! # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the workspace's fake
//! let cuda = driver()?;
//! match cuda.resolve(Function::cuLaunchHostFunc_v2) {
//!     Ok(_) => println!("host functions with a sync mode (CUDA 13.2+)"),
//!     // Newer than the driver (nothing was asked of it), or the driver lacks it.
//!     Err(e @ (Error::DriverTooOld { .. } | Error::SymbolMissing { .. })) => {
//!         println!("falling back to cuLaunchHostFunc: {e}");
//!     }
//!     Err(e) => return Err(e), // the lookup itself failed
//! }
//! // The same through the typed entry, with the C signature when it is there:
//! let available = cuda.raw().cuStreamGetId().is_ok();
//! // Or by version: every entry carries the ABI version its signature binds.
//! let gate = Function::cuStreamGetId.info().version; // 12000, CUDA 12.0
//! assert_eq!(available, cuda.version().0 >= gate as i32);
//! # Ok(()) }
//! ```
//!
//! Both default-stream semantics are available at once: [`Driver::legacy`] and
//! [`Driver::per_thread`] (`nvcc --default-stream per-thread`) are two tables over one library. The
//! process's default, which [`driver`] returns, is chosen at the first load:
//! [`LoadOptions::default_stream`], or `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM=1`.

#![warn(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

// The modules, lowest layer first: each imports only from those above it in this list (and from the
// generated `types`/`generated_result_codes`). DESIGN.md draws the order; scripts check it.
mod chosen;
mod driver;
mod error;
pub mod functions;
mod library;
mod resolve;
mod streams;
mod table;
mod version;

/// The types, constants and `PFN_` typedefs of `cuda.h` and `cudaTypedefs.h`, generated by bindgen
/// (see `scripts/regenerate-bindings`). Enums are newtypes with associated constants
/// (`CUresult::CUDA_SUCCESS`), so a value the header does not know is still a valid value.
#[allow(
    warnings,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    rustdoc::all
)]
pub mod types {
    include!("generated/bindings.rs");
}

mod generated_result_codes {
    include!("generated/result_codes.rs");
}

pub use chosen::{CFunction, ChosenFunction};
pub use driver::{Driver, LoadOptions, PER_THREAD_ENV, driver};
pub use error::{CallError, CallErrorKind, DriverError, Error, MissingReason};
pub use functions::RawFunctions;
pub use library::{
    DEFAULT_NAMES, DriverLibrary, LIBRARY_ENV, LibraryKind, LibraryOrigin, LoadAttempt,
};
pub use resolve::ResolutionPath;
pub use streams::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, DefaultStream};
pub use table::{FUNCTION_COUNT, Function, FunctionInfo};
pub use version::DriverVersion;
