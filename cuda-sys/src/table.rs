//! The declarative table of every driver function, in the manner of cuda.core's
//! `X(cuLaunchHostFunc, 10000)` list.
//!
//! `generated/functions.rs` (written by `tools/codegen` from `cudaTypedefs.h`, never by hand) holds one
//! line per function: its name, its exact C parameters, the ABI version that signature binds, the
//! symbol `cuGetProcAddress` takes, the library exports for old drivers, and the `PFN_` typedef it
//! was matched to. [`driver_function_table!`] turns that list into:
//!
//! - [`Function`], one variant per entry, and its [`FunctionInfo`];
//! - [`RawFunctions`], a method per entry returning the resolved C function pointer;
//! - a method per entry on [`Driver`] that calls the function and returns `Result<(), Error>`;
//! - a compile-time check that each signature is its `PFN_` typedef.

use std::ffi::{CStr, c_void};
use std::fmt;

use crate::driver::Driver;
use crate::error::Error;
#[allow(unused_imports)]
use crate::types::*;

/// What the table knows of one driver function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionInfo {
    /// The name users write, such as `cuMemAlloc` or `cuLaunchHostFunc_v2`.
    pub name: &'static str,
    /// The base name `cuGetProcAddress` takes, such as `cuMemAlloc` or `cuLaunchHostFunc`.
    pub symbol: &'static CStr,
    /// The ABI version the bound signature belongs to (`1000 * major + 10 * minor`).
    pub version: u32,
    /// The library export of that version (`cuMemAlloc_v2`), looked up on drivers older than 11.3.
    pub export: &'static CStr,
    /// The export with per-thread default-stream semantics (`cuStreamSynchronize_ptsz`), if any.
    pub per_thread_export: Option<&'static CStr>,
    /// The ABI version of the per-thread variant (`7000` for `cuStreamSynchronize_ptsz`), if any:
    /// what is asked of `cuGetProcAddress` (and gated) when the driver is loaded for per-thread
    /// default-stream semantics.
    pub per_thread_version: Option<u32>,
}

impl Function {
    /// What the table knows of this function.
    #[inline]
    pub fn info(self) -> &'static FunctionInfo {
        &FUNCTION_INFO[self as usize]
    }

    /// The name users write.
    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The resolved C function pointers of the table, with their exact signatures: `driver.raw()`.
///
/// Each method resolves its entry on first use (gated on the driver's version) and returns the
/// pointer, which stays valid for the life of the process. Calling it is `unsafe`: the C function's
/// contract (valid handles, pointers valid for what it reads and writes) is the caller's to uphold.
#[derive(Clone, Copy)]
pub struct RawFunctions<'d> {
    driver: &'d Driver,
}

impl Driver {
    /// The table as raw C function pointers, for binding authors who want the `CUresult` itself.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_sys::Error> {
    /// let driver = cuda_sys::driver()?;
    /// let synchronize = driver.raw().cuStreamSynchronize()?;
    /// // SAFETY: CU_STREAM_LEGACY is always a valid stream handle once a context is current.
    /// let code = unsafe { synchronize(cuda_sys::CU_STREAM_LEGACY) };
    /// # let _ = code; Ok(()) }
    /// ```
    #[inline]
    pub fn raw(&self) -> RawFunctions<'_> {
        RawFunctions { driver: self }
    }
}

const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a table string with an interior NUL"),
    }
}

const fn optional_cstr(s: &'static str) -> Option<&'static CStr> {
    if s.len() == 1 { None } else { Some(cstr(s)) }
}

const fn optional_version(v: u32) -> Option<u32> {
    if v == 0 { None } else { Some(v) }
}

/// Expands the generated list (see the module docs) into the table.
macro_rules! driver_function_table {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) =
            $version:literal, $symbol:literal, $export:literal, $per_thread:literal,
            $per_thread_version:literal, $pfn:ident;
    )*) => {
        /// Every function of the table, in `cuda.h`'s order.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum Function {
            $( $(#[doc = $doc])* $name, )*
        }

        impl Function {
            /// Every function of the table, in `cuda.h`'s order.
            pub const ALL: &'static [Function] = &[ $( Function::$name, )* ];
        }

        /// How many functions the table has.
        pub const FUNCTION_COUNT: usize = [$( stringify!($name) ),*].len();

        static FUNCTION_INFO: [FunctionInfo; FUNCTION_COUNT] = [$(
            FunctionInfo {
                name: stringify!($name),
                symbol: cstr(concat!($symbol, "\0")),
                version: $version,
                export: cstr(concat!($export, "\0")),
                per_thread_export: optional_cstr(concat!($per_thread, "\0")),
                per_thread_version: optional_version($per_thread_version),
            },
        )*];

        #[allow(non_snake_case, clippy::too_many_arguments, rustdoc::broken_intra_doc_links)]
        impl RawFunctions<'_> {
            $(
                $(#[doc = $doc])*
                ///
                #[doc = concat!("The resolved `", stringify!($name), "` (ABI version ", stringify!($version), ").")]
                ///
                /// # Errors
                /// [`Error::DriverTooOld`] if the driver's version is older than the ABI version;
                /// [`Error::SymbolMissing`] if the driver does not provide it.
                #[inline]
                pub fn $name(&self) -> Result<unsafe extern "C" fn($($ty),*) -> CUresult, Error> {
                    let p: *mut c_void = self.driver.entry(Function::$name)?;
                    // SAFETY: `entry` returns the address the driver gave for this symbol at this
                    // ABI version (or the matching export), non-null; that version's C signature is
                    // this type (checked against the PFN typedef at compile time below).
                    Ok(unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CUresult>(p)
                    })
                }
            )*
        }

        #[allow(non_snake_case, clippy::too_many_arguments, rustdoc::broken_intra_doc_links)]
        impl Driver {
            $(
                $(#[doc = $doc])*
                ///
                #[doc = concat!("Calls `", stringify!($name), "` (ABI version ", stringify!($version), ").")]
                ///
                /// # Safety
                /// The arguments must meet the C function's contract in the CUDA Driver API
                /// reference: valid handles, and pointers valid for every read and write it makes
                /// for as long as it makes them.
                ///
                /// # Errors
                /// [`Error::Driver`] with the function's result code if it is not `CUDA_SUCCESS`;
                /// [`Error::DriverTooOld`] or [`Error::SymbolMissing`] if it cannot be called.
                #[inline]
                pub unsafe fn $name(&self, $($arg: $ty),*) -> Result<(), Error> {
                    let f = self.raw().$name()?;
                    // SAFETY: the caller meets the function's contract (see # Safety).
                    let code = unsafe { f($($arg),*) };
                    self.check(code, stringify!($name))
                }
            )*
        }

        // Each signature above is exactly its PFN typedef from cudaTypedefs.h.
        const _: () = {
            $( let _: $pfn = None::<unsafe extern "C" fn($($ty),*) -> CUresult>; )*
        };
    };
}

include!("generated/functions.rs");
