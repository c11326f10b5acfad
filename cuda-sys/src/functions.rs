//! Every driver function as a typed entry: an index of the table, one constant per function and per
//! older ABI variant of one (`cuCtxCreate` bound at 12.5, `cuCtxCreate_v2` at 3.2, `cuCtxCreate_v3`
//! at 11.4, ...), each carrying its exact C signature and `cuda.h`'s documentation of it (the
//! header's Doxygen comment as Markdown: parameters, results, links to the functions, types and
//! constants it names).
//!
//! The same functions are methods of [`Driver`] (checked: `driver.cuCtxCreate(..)`) and of
//! [`RawFunctions`] (`driver.raw().cuCtxCreate()`, the C pointer). An entry is for code that picks a
//! function at run time: [`Driver::function`] resolves one, [`Driver::newest_variant`] the newest
//! variant of its function with its signature that the driver has, [`Driver::newest`] the newest
//! of a list:
//!
//! ```no_run
//! use cuda_dl_sys::functions::{cuEventElapsedTime, cuEventElapsedTime_v2000};
//! # fn main() -> Result<(), cuda_dl_sys::Error> {
//! # let (start, end): (cuda_dl_sys::types::CUevent, cuda_dl_sys::types::CUevent) = todo!();
//! let driver = cuda_dl_sys::driver()?;
//! // 12.8's ABI where the driver has it, else the 2.0 one (same signature, older semantics).
//! let elapsed = driver.newest_variant(cuEventElapsedTime)?;
//! println!("using {}", elapsed.function());
//! assert_eq!(cuEventElapsedTime.variants().len(), 2);
//! let mut ms = 0.0f32;
//! // SAFETY: two recorded events of the current context; `ms` is a valid out-pointer. An error
//! // names the variant that was called.
//! unsafe { elapsed.call((&raw mut ms, start, end))? };
//! // The same, with the list written out.
//! let same = driver.newest(&[cuEventElapsedTime, cuEventElapsedTime_v2000])?;
//! assert_eq!(elapsed.function(), same.function());
//! # Ok(()) }
//! ```
//!
//! `src/generated/functions.rs` (generated from `cuda.h` and `cudaTypedefs.h`, never edited by hand)
//! is the list; `driver_function_table!` here turns it into these constants, the methods (each
//! says in a line what its function does and links to its entry here), and a compile-time check
//! that each signature is its `PFN_` typedef. (`table.rs` reads the same list into the data.)

use std::ffi::c_void;
use std::marker::PhantomData;

use crate::chosen::ChosenFunction;
use crate::driver::Driver;
use crate::error::{CallError, CallErrorKind, Error};
use crate::resolve;
use crate::table::{Function, FunctionInfo};
#[allow(unused_imports)]
use crate::types::*;

/// One function of the table with its C signature `F` (an `unsafe extern "C" fn(..) -> CUresult`).
///
/// Only this module makes entries, one per function, so `F` is always the function's own signature.
pub struct Entry<F> {
    function: Function,
    /// The entries of the same symbol with this signature `F`, newest first (this one among them).
    family: &'static [Function],
    signature: PhantomData<F>,
}

impl<F> Entry<F> {
    const fn new(function: Function, family: &'static [Function]) -> Self {
        Entry {
            function,
            family,
            signature: PhantomData,
        }
    }

    /// The functions of the same symbol whose signature is `F` too (this one among them), newest ABI
    /// version first: what [`Driver::newest_variant`] chooses among.
    pub fn variants(self) -> &'static [Function] {
        self.family
    }

    /// The table's function.
    pub const fn function(self) -> Function {
        self.function
    }

    /// What the table knows of it.
    pub fn info(self) -> &'static FunctionInfo {
        self.function.info()
    }
}

impl<F> Clone for Entry<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Entry<F> {}

impl<F> std::fmt::Debug for Entry<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Entry({})", self.function)
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
    /// # fn main() -> Result<(), cuda_dl_sys::Error> {
    /// let driver = cuda_dl_sys::driver()?;
    /// let synchronize = driver.raw().cuStreamSynchronize()?;
    /// // SAFETY: CU_STREAM_LEGACY is always a valid stream handle once a context is current.
    /// let code = unsafe { synchronize(cuda_dl_sys::CU_STREAM_LEGACY) };
    /// # let _ = code; Ok(()) }
    /// ```
    #[inline]
    pub fn raw(&self) -> RawFunctions<'_> {
        RawFunctions { driver: self }
    }

    /// The C function pointer of `entry`, resolved in this table (on first use, gated on the
    /// driver's version).
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] if the driver's version is older than the entry's ABI version;
    /// [`Error::SymbolMissing`] if the driver does not provide it; [`Error::Driver`] if the lookup
    /// itself failed.
    #[inline]
    pub fn function<F: Copy>(&self, entry: Entry<F>) -> Result<F, Error> {
        let p = self.entry(entry.function)?;
        // SAFETY: `Entry<F>` is made only in this module, with `F` the C signature of its function
        // at its ABI version (checked against the PFN typedef below); `entry` returned that
        // function's address, non-null. A function pointer has a data pointer's size (checked).
        Ok(unsafe { cast::<F>(p) })
    }

    /// The newest of `entries` (variants of one function with one signature, in any order) that
    /// this driver has: for binding authors who would otherwise write the version ladder by hand.
    /// Entries newer than the driver, or that it lacks, are skipped. The [`ChosenFunction`] says
    /// which was chosen and calls it checked, with errors that name it.
    ///
    /// # Errors
    /// If none is available, the error of the oldest ([`Error::DriverTooOld`] or
    /// [`Error::SymbolMissing`]); [`Error::Driver`] at once if a lookup itself failed.
    /// [`Error::InvalidSymbolName`] for an empty list.
    pub fn newest<F: Copy>(&self, entries: &[Entry<F>]) -> Result<ChosenFunction<F>, Error> {
        let version = |e: &Entry<F>| resolve::variant(e.info(), self.default_stream()).0;
        let mut sorted: Vec<Entry<F>> = entries.to_vec();
        sorted.sort_by_key(|e| std::cmp::Reverse(version(e)));
        match self.first_available(sorted.iter().map(|e| e.function)) {
            // SAFETY: as in `function`: `F` is the signature of every entry of `entries`.
            Ok((p, function)) => Ok(ChosenFunction::new(unsafe { cast::<F>(p) }, function)),
            Err(Some(error)) => Err(error.into()),
            Err(None) => Err(Error::InvalidSymbolName(
                "(an empty list of entries given to Driver::newest)".into(),
            )),
        }
    }

    /// The first of `functions` this driver has, and its address; a failed lookup ends the search
    /// at once. `Err(None)` if `functions` is empty, else the error of the last one tried.
    fn first_available(
        &self,
        functions: impl IntoIterator<Item = Function>,
    ) -> Result<(*mut c_void, Function), Option<CallError>> {
        let mut last = None;
        for function in functions {
            match self.entry(function) {
                Ok(p) => return Ok((p, function)),
                Err(error) if error.kind() == CallErrorKind::LookupFailed => {
                    return Err(Some(error));
                }
                Err(error) => last = Some(error),
            }
        }
        Err(last)
    }
}

impl Driver {
    /// The newest ABI variant of `entry`'s function with `entry`'s signature that this driver has:
    /// `driver.newest_variant(cuEventElapsedTime)` is 12.8's `cuEventElapsedTime` where the
    /// driver has it, else 2.0's `cuEventElapsedTime_v2000`. The variants come from the table
    /// ([`Entry::variants`]); no version is written by hand. The [`ChosenFunction`] says which was
    /// chosen and calls it checked, with errors that name it.
    ///
    /// # Errors
    /// If none is available, the error of the oldest ([`Error::DriverTooOld`] or
    /// [`Error::SymbolMissing`]); [`Error::Driver`] at once if a lookup itself failed.
    pub fn newest_variant<F: Copy>(&self, entry: Entry<F>) -> Result<ChosenFunction<F>, Error> {
        match self.first_available(entry.family.iter().copied()) {
            // SAFETY: every function of an entry's family has the entry's signature `F` (the
            // generator groups them by signature; checked at compile time below).
            Ok((p, function)) => Ok(ChosenFunction::new(unsafe { cast::<F>(p) }, function)),
            Err(Some(error)) => Err(error.into()),
            // A family holds its own entry, so it is never empty: this only restates that.
            Err(None) => self
                .function(entry)
                .map(|f| ChosenFunction::new(f, entry.function)),
        }
    }
}

/// `p` as the function pointer type `F`.
///
/// # Safety
/// `p` must be the non-null address of a function whose C signature is `F`.
#[inline(always)]
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: the sizes are equal (checked above) and the caller vouches that `p` is a function of
    // type `F`.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// Expands the generated list (see the module docs) into the entries and the methods. Each entry
/// carries the header's documentation, as Markdown; each method says in a line what the function
/// does and links to its entry.
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
        $(
            #[doc = $summary]
            ///
            #[doc = concat!(
                "ABI version ", $version_text, " (`", stringify!($pfn), "`). [`Driver::",
                stringify!($name), "`](crate::Driver::", stringify!($name), ") calls it, checked; [`",
                "RawFunctions::", stringify!($name), "`](crate::RawFunctions::", stringify!($name),
                ") returns its C pointer."
            )]
            ///
            $(#[doc = $doc])*
            // The generated links spell out paths that also resolve here by name: they are used
            // where they would not (the `Function` enum in `table`) too.
            #[allow(non_upper_case_globals, rustdoc::redundant_explicit_links)]
            pub const $name: Entry<unsafe extern "C" fn($($ty),*) -> CUresult> =
                Entry::new(Function::$name, &[$(Function::$family),*]);
        )*

        #[allow(non_snake_case, clippy::too_many_arguments, rustdoc::redundant_explicit_links)]
        impl RawFunctions<'_> {
            $(
                #[doc = concat!(
                    "The C function pointer of [`", stringify!($name), "`](crate::functions::",
                    stringify!($name), ") (ABI version ", $version_text, "): ", $summary
                )]
                ///
                /// # Errors
                /// [`Error::DriverTooOld`] if the driver's version is older than the ABI version;
                /// [`Error::SymbolMissing`] if the driver does not provide it.
                #[inline]
                pub fn $name(&self) -> Result<unsafe extern "C" fn($($ty),*) -> CUresult, Error> {
                    self.driver.function($name)
                }
            )*
        }

        #[allow(non_snake_case, clippy::too_many_arguments, rustdoc::redundant_explicit_links)]
        impl Driver {
            $(
                #[doc = $summary]
                ///
                #[doc = concat!(
                    "Calls [`", stringify!($name), "`](crate::functions::", stringify!($name),
                    ") (ABI version ", $version_text, "), whose page has the header's full ",
                    "documentation, and checks its result."
                )]
                ///
                /// # Safety
                /// The arguments must meet the C function's contract in the CUDA Driver API
                /// reference: valid handles, and pointers valid for every read and write it makes
                /// for as long as it makes them.
                ///
                /// # Errors
                /// [`CallErrorKind::Driver`] with the function's result code if it is not
                /// `CUDA_SUCCESS`; [`CallErrorKind::DriverTooOld`] or
                /// [`CallErrorKind::SymbolMissing`] if it cannot be called.
                #[inline]
                pub unsafe fn $name(&self, $($arg: $ty),*) -> Result<(), CallError> {
                    let p = self.entry(Function::$name)?;
                    // SAFETY: `entry` returned the address the driver gave for this symbol at this
                    // ABI version (or the matching export), non-null; that version's C signature
                    // is this type (checked against the PFN typedef below).
                    let f = unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CUresult>(p)
                    };
                    // SAFETY: the caller meets the function's contract (see # Safety).
                    let code = unsafe { f($($arg),*) };
                    if code == CUresult::CUDA_SUCCESS {
                        Ok(())
                    } else {
                        Err(CallError::driver(Function::$name, code))
                    }
                }
            )*
        }

        // Each signature above is exactly its PFN typedef from cudaTypedefs.h, and an entry's
        // family all have its signature (an array's elements have one type).
        const _: () = {
            $( let _: $pfn = None::<unsafe extern "C" fn($($ty),*) -> CUresult>; )*
            $( let _ = [$name, $($family),*]; )*
        };
    };
}

include!("generated/functions.rs");
