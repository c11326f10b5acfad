//! The declarative table of every driver function, in the manner of cuda.core's
//! `X(cuLaunchHostFunc, 10000)` list (10000 is CUDA 10.0): what each function is (this module),
//! not how it is called.
//!
//! `generated/functions.rs` (written by `tools/codegen` from `cudaTypedefs.h`, never by hand) holds one
//! line per function: its name, its exact C parameters, the ABI version that signature binds, the
//! symbol `cuGetProcAddress` takes, the library exports for old drivers, the `PFN_` typedef it
//! was matched to, and, where the header marks that typedef's version a placeholder, that number.
//! It is read twice, by two macros of the same name: here into the data ([`Function`], its
//! [`FunctionInfo`], [`FUNCTION_COUNT`]), and in `functions.rs`, at the top of the crate, into the
//! methods that call each function.

use std::ffi::CStr;
use std::fmt;

/// What the table knows of one driver function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionInfo {
    /// The name users write, such as `cuMemAlloc` or `cuLaunchHostFunc_v2`.
    pub name: &'static str,
    /// The base name `cuGetProcAddress` takes, such as `cuMemAlloc` or `cuLaunchHostFunc`.
    pub symbol: &'static CStr,
    /// The ABI version the bound signature belongs to, as the driver numbers versions
    /// (`1000 * major + 10 * minor`: 3020 is CUDA 3.2; [`DriverVersion`](crate::DriverVersion)
    /// prints it so). A `u32`, since an ABI version is never negative (as
    /// [`Error::DriverTooOld`](crate::Error::DriverTooOld)'s `required`); `DriverVersion` wraps an
    /// `i32` because it holds what the driver wrote into a C `int` (`cuDriverGetVersion`). Compare
    /// them as `DriverVersion(version as i32)` (every version fits).
    pub version: u32,
    /// The library export of that version (`cuMemAlloc_v2`), looked up on drivers older than 11.3.
    pub export: &'static CStr,
    /// The export with per-thread default-stream semantics (`cuStreamSynchronize_ptsz`), if any.
    pub per_thread_export: Option<&'static CStr>,
    /// The ABI version of the per-thread variant (7000, CUDA 7.0, for `cuStreamSynchronize_ptsz`),
    /// if any: what is asked of `cuGetProcAddress` (and gated) when the driver is loaded for
    /// per-thread default-stream semantics.
    pub per_thread_version: Option<u32>,
    /// The version in the name of the entry's `PFN_` typedef where `cudaTypedefs.h` marks that
    /// number as a placeholder (`PFN_cuLaunchHostFunc_v13010`: "Update 13010 to a proper version
    /// number"), else `None`. [`version`](Self::version) is then the version the driver registers
    /// the variant at (13020, CUDA 13.2, for `cuLaunchHostFunc_v2`: the generator's
    /// `tools/codegen/registered_versions.rs` lists each with where its number comes from), and
    /// the pointer `cuGetProcAddress` returns for the entry is checked against the library's
    /// export of this variant ([`export`](Self::export), or the per-thread one) before it is used:
    /// another pointer is refused as
    /// [`MissingReason::OtherVariant`](crate::MissingReason::OtherVariant).
    pub placeholder_version: Option<u32>,
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
        #[summary = $summary:literal]
        $(#[doc = $doc:literal])*
        $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) =
            $version:literal, $version_text:literal, $symbol:literal, $export:literal,
            $per_thread:literal, $per_thread_version:literal, $pfn:ident,
            $(placeholder $placeholder:literal,)?
            [$($family:ident),* $(,)?];
    )*) => {
        /// Every function of the table, in `cuda.h`'s order.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum Function {
            $(
                #[doc = $summary]
                ///
                #[doc = concat!(
                    "[`functions::", stringify!($name), "`](crate::functions::",
                    stringify!($name), ") has the header's documentation."
                )]
                $name,
            )*
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
                placeholder_version: optional_version(0 $(+ $placeholder)?),
            },
        )*];

    };
}

include!("generated/functions.rs");
