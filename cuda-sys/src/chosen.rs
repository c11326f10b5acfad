//! A function chosen at run time among ABI variants ([`Driver::newest`](crate::Driver::newest),
//! [`Driver::newest_variant`](crate::Driver::newest_variant)): its C pointer, which table entry it
//! is, and a checked call whose error names that entry.

use std::fmt;

use crate::error::CallError;
use crate::table::Function;
use crate::types::CUresult;

/// The function [`Driver::newest`](crate::Driver::newest) or
/// [`Driver::newest_variant`](crate::Driver::newest_variant) chose: its C pointer, of the
/// signature `F` every candidate shares, and the table entry it is.
///
/// [`call`](ChosenFunction::call) calls it and checks its result into a [`CallError`] that names
/// the variant chosen (`cuDevicePrimaryCtxRelease_v7000` on a driver older than 11.0), so no
/// function name is written by hand; [`check`](ChosenFunction::check) does the same for a result
/// got by calling [`pointer`](ChosenFunction::pointer) directly.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_dl_sys::Error> {
/// let driver = cuda_dl_sys::driver()?;
/// let release = driver.newest_variant(cuda_dl_sys::functions::cuDevicePrimaryCtxRelease)?;
/// let device = 0;
/// // SAFETY: the caller holds a retain of device 0's primary context, which this gives up.
/// unsafe { release.call((device,))? };
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct ChosenFunction<F> {
    pointer: F,
    function: Function,
}

impl<F: Copy> ChosenFunction<F> {
    /// `pointer` is `function`'s address, of the C signature `F`.
    pub(crate) fn new(pointer: F, function: Function) -> Self {
        ChosenFunction { pointer, function }
    }

    /// The C function pointer, for calling it directly (then [`check`](Self::check) its result).
    #[inline]
    pub fn pointer(self) -> F {
        self.pointer
    }

    /// Which table entry was chosen.
    #[inline]
    pub fn function(self) -> Function {
        self.function
    }

    /// `Ok(())` for `CUDA_SUCCESS`; else the error of a call of the chosen function that returned
    /// `code`.
    ///
    /// # Errors
    /// [`CallErrorKind::Driver`](crate::CallErrorKind::Driver) naming the chosen function, with
    /// `code`, for any code other than `CUDA_SUCCESS`.
    #[inline]
    pub fn check(self, code: CUresult) -> Result<(), CallError> {
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CallError::driver(self.function, code))
        }
    }

    /// Calls the chosen function with `args`, the tuple of its arguments (`(device,)`,
    /// `(&raw mut ms, start, end)`), each of its parameter's exact type (a tuple does not coerce
    /// `&mut T` to `*mut T` as a call does), and checks its result.
    ///
    /// # Safety
    /// The arguments must meet the C function's contract in the CUDA Driver API reference (for the
    /// ABI version chosen): valid handles, and pointers valid for every read and write it makes for
    /// as long as it makes them.
    ///
    /// # Errors
    /// [`CallErrorKind::Driver`](crate::CallErrorKind::Driver) naming the chosen function, with
    /// its result code, if that is not `CUDA_SUCCESS`.
    #[inline]
    pub unsafe fn call<Args>(self, args: Args) -> Result<(), CallError>
    where
        F: CFunction<Args>,
    {
        // SAFETY: the caller meets the function's contract (see # Safety).
        let code = unsafe { self.pointer.call_with(args) };
        self.check(code)
    }
}

impl<F> fmt::Debug for ChosenFunction<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChosenFunction({})", self.function)
    }
}

/// A driver function's C pointer, `unsafe extern "C" fn(..) -> CUresult`, called with its
/// arguments as the tuple `Args`: what [`ChosenFunction::call`] calls. Implemented for every such
/// signature of up to 16 parameters (the table's longest); sealed.
pub trait CFunction<Args>: Copy + sealed::Sealed<Args> {
    /// Calls the function with `args`.
    ///
    /// # Safety
    /// As for [`ChosenFunction::call`]: the C function's contract.
    unsafe fn call_with(self, args: Args) -> CUresult;
}

mod sealed {
    /// Only this module's implementations of [`CFunction`](super::CFunction) exist.
    pub trait Sealed<Args> {}
}

/// Implements [`CFunction`] for the signature with these parameter types.
macro_rules! c_function {
    ($($arg:ident),*) => {
        impl<$($arg),*> sealed::Sealed<($($arg,)*)> for unsafe extern "C" fn($($arg),*) -> CUresult {}

        impl<$($arg),*> CFunction<($($arg,)*)> for unsafe extern "C" fn($($arg),*) -> CUresult {
            #[inline]
            #[allow(non_snake_case)]
            unsafe fn call_with(self, ($($arg,)*): ($($arg,)*)) -> CUresult {
                // SAFETY: the caller meets the function's contract (see the trait's # Safety).
                unsafe { self($($arg),*) }
            }
        }
    };
}

c_function!();
c_function!(A);
c_function!(A, B);
c_function!(A, B, C);
c_function!(A, B, C, D);
c_function!(A, B, C, D, E);
c_function!(A, B, C, D, E, G);
c_function!(A, B, C, D, E, G, H);
c_function!(A, B, C, D, E, G, H, I);
c_function!(A, B, C, D, E, G, H, I, J);
c_function!(A, B, C, D, E, G, H, I, J, K);
c_function!(A, B, C, D, E, G, H, I, J, K, L);
c_function!(A, B, C, D, E, G, H, I, J, K, L, M);
c_function!(A, B, C, D, E, G, H, I, J, K, L, M, N);
c_function!(A, B, C, D, E, G, H, I, J, K, L, M, N, O);
c_function!(A, B, C, D, E, G, H, I, J, K, L, M, N, O, P);
c_function!(A, B, C, D, E, G, H, I, J, K, L, M, N, O, P, Q);

#[cfg(test)]
mod tests {
    use super::ChosenFunction;
    use crate::error::{CallErrorKind, Error};
    use crate::table::Function;
    use crate::types::{CUdevice, CUresult};

    unsafe extern "C" fn refuse(device: CUdevice) -> CUresult {
        if device == 7 {
            CUresult::CUDA_SUCCESS
        } else {
            CUresult::CUDA_ERROR_INVALID_DEVICE
        }
    }

    #[test]
    fn a_chosen_functions_call_is_checked_into_an_error_naming_the_variant_chosen() {
        let f: unsafe extern "C" fn(CUdevice) -> CUresult = refuse;
        let chosen = ChosenFunction::new(f, Function::cuDevicePrimaryCtxRelease_v7000);
        // SAFETY: `refuse` has no preconditions.
        assert_eq!(unsafe { chosen.call((7,)) }, Ok(()));
        // SAFETY: as above.
        let err = unsafe { chosen.call((0,)) }.unwrap_err();
        assert_eq!(err.function(), Function::cuDevicePrimaryCtxRelease_v7000);
        assert_eq!(err.kind(), CallErrorKind::Driver);
        assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_INVALID_DEVICE));
        match Error::from(err) {
            Error::Driver(e) => assert_eq!(e.function(), Some("cuDevicePrimaryCtxRelease_v7000")),
            other => panic!("{other:?}"),
        }
        assert_eq!(chosen.check(CUresult::CUDA_SUCCESS), Ok(()));
        assert_eq!(
            chosen
                .check(CUresult::CUDA_ERROR_NOT_READY)
                .unwrap_err()
                .code(),
            Some(CUresult::CUDA_ERROR_NOT_READY)
        );
    }
}
