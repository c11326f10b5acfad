//! Launch options: the driver thread's sync mode (`cuLaunchHostFunc_v2`).

use cuda_dl_sys::types::{CUhostTaskSyncMode, CUstream};

use crate::support::error::Error;

/// How the driver's thread waits for host functions to become ready (`CUhostTaskSyncMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostTaskSyncMode {
    /// `CU_HOST_TASK_BLOCKING`: the thread blocks until host tasks are ready (the default).
    Blocking,
    /// `CU_HOST_TASK_SPINWAIT`: the thread spins, for lower latency at the cost of a busy core.
    SpinWait,
}

impl HostTaskSyncMode {
    pub(crate) fn raw(self) -> u32 {
        match self {
            HostTaskSyncMode::Blocking => CUhostTaskSyncMode::CU_HOST_TASK_BLOCKING.0,
            HostTaskSyncMode::SpinWait => CUhostTaskSyncMode::CU_HOST_TASK_SPINWAIT.0,
        }
    }
}

/// Options of a launch or a graph host node.
///
/// `sync_mode: Some(..)` needs `cuLaunchHostFunc_v2` (and, for graph nodes, the `syncMode` field
/// of the v2 host-node parameters, also new in 13.2): drivers of CUDA 13.2 and newer. The pinned
/// header's `cudaTypedefs.h` names its typedef `PFN_cuLaunchHostFunc_v13010`, a number it marks
/// "Update 13010 to a proper version number": the function first ships in CUDA 13.2 (the 13.1
/// headers have none) and the driver registers it at 13020, where NVIDIA's cuda-bindings 13.5
/// asks for it; asked at 13010, a driver answers with the three-argument `cuLaunchHostFunc`,
/// which would drop the mode. So cuda-dl-sys's table requests and gates it at 13020 (its
/// generator's `tools/codegen/registered_versions.rs`), and refuses a pointer that is not the
/// driver's `cuLaunchHostFunc_v2` export (`SymbolMissing` with `MissingReason::OtherVariant`).
/// On an older driver the launch returns `DriverTooOld { function: "cuLaunchHostFunc_v2",
/// required: 13020, found }` rather than silently ignoring the option: a caller who asked for
/// spin-waiting wants to know it did not happen. `sync_mode: None` (the default) uses
/// `cuLaunchHostFunc`, on any driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LaunchOptions {
    /// The driver thread's sync mode; `None` leaves the driver's default.
    pub sync_mode: Option<HostTaskSyncMode>,
}

impl LaunchOptions {
    /// Options with this sync mode.
    pub fn with_sync_mode(sync_mode: HostTaskSyncMode) -> Self {
        LaunchOptions {
            sync_mode: Some(sync_mode),
        }
    }

    /// Fails with `DriverTooOld` if these options need a newer driver than `driver`.
    pub(crate) fn check_supported(&self, driver: &cuda_dl_sys::Driver) -> Result<(), Error> {
        if self.sync_mode.is_some() {
            driver.raw().cuLaunchHostFunc_v2()?;
        }
        Ok(())
    }
}

/// The enqueue call these options select: `cuLaunchHostFunc` or `cuLaunchHostFunc_v2`.
pub(crate) enum LaunchCall {
    V1(
        unsafe extern "C" fn(
            CUstream,
            cuda_dl_sys::types::CUhostFn,
            *mut std::ffi::c_void,
        ) -> cuda_dl_sys::types::CUresult,
    ),
    V2(
        unsafe extern "C" fn(
            CUstream,
            cuda_dl_sys::types::CUhostFn,
            *mut std::ffi::c_void,
            u32,
        ) -> cuda_dl_sys::types::CUresult,
        u32,
    ),
}

impl LaunchCall {
    /// Resolves the call (so a too-old driver is reported before anything is enqueued).
    pub(crate) fn resolve(
        driver: &cuda_dl_sys::Driver,
        options: &LaunchOptions,
    ) -> Result<Self, Error> {
        Ok(match options.sync_mode {
            None => LaunchCall::V1(driver.raw().cuLaunchHostFunc()?),
            Some(mode) => LaunchCall::V2(driver.raw().cuLaunchHostFunc_v2()?, mode.raw()),
        })
    }

    /// Enqueues `f(user_data)`; returns the driver's result and the name of the function called.
    ///
    /// # Safety
    /// As `cuLaunchHostFunc`: a valid stream, and `f(user_data)` sound to call on the driver thread.
    pub(crate) unsafe fn call(
        &self,
        stream: CUstream,
        f: unsafe extern "C" fn(*mut std::ffi::c_void),
        user_data: *mut std::ffi::c_void,
    ) -> (cuda_dl_sys::types::CUresult, &'static str) {
        match *self {
            // SAFETY: the caller's contract.
            LaunchCall::V1(launch) => (
                unsafe { launch(stream, Some(f), user_data) },
                "cuLaunchHostFunc",
            ),
            LaunchCall::V2(launch, mode) => {
                // SAFETY: the caller's contract; `mode` is a valid CUhostTaskSyncMode.
                (
                    unsafe { launch(stream, Some(f), user_data, mode) },
                    "cuLaunchHostFunc_v2",
                )
            }
        }
    }
}
