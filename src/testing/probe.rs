//! A host function that counts its runs, and the counter with its owners: what most tests launch.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::owners::{Drops, Owner};

/// A C host function that adds one to the `AtomicUsize` its user data points at.
///
/// # Safety
/// `data` must point at an `AtomicUsize` that outlives the call (keep it in the launch's owners).
pub unsafe extern "C" fn bump(data: *mut c_void) {
    // SAFETY: the caller's contract: `data` points at a live AtomicUsize.
    unsafe { &*data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
}

/// A C host function for bytes launches (`launch_host_function_with_bytes`): its bytes start with
/// the address of an `AtomicUsize` (as [`address_bytes`] makes them), to which it adds one.
///
/// # Safety
/// `data` must point at bytes starting with the exposed address of an `AtomicUsize` that outlives
/// the call.
pub unsafe extern "C" fn bump_from_bytes(data: *mut c_void) {
    // SAFETY: the copied bytes start with the exposed address of a live `AtomicUsize`.
    let address = unsafe { data.cast::<usize>().read_unaligned() };
    // SAFETY: as above: the address of a live `AtomicUsize`, exposed by `address_bytes`.
    unsafe { &*std::ptr::with_exposed_provenance::<AtomicUsize>(address) }
        .fetch_add(1, Ordering::SeqCst);
}

/// The bytes of a bytes launch of [`bump_from_bytes`] that bumps `counter`: its exposed address,
/// then zeros up to `LEN` bytes (`LEN` at least the size of an address).
pub fn address_bytes<const LEN: usize>(counter: &AtomicUsize) -> [u8; LEN] {
    let address = std::ptr::from_ref(counter)
        .expose_provenance()
        .to_ne_bytes();
    let mut bytes = [0; LEN];
    bytes[..address.len()].copy_from_slice(&address);
    bytes
}

/// A run counter and the counted owners of the host functions that bump it.
pub struct Probe {
    runs: Arc<AtomicUsize>,
    /// The owners handed out by [`Probe::closure`] and [`Probe::owners`].
    pub drops: Arc<Drops>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe::new()
    }
}

impl Probe {
    /// A counter at zero, no owners yet.
    pub fn new() -> Probe {
        Probe {
            runs: Arc::new(AtomicUsize::new(0)),
            drops: Drops::new(),
        }
    }

    /// A closure that counts its runs and owns one counted owner.
    pub fn closure(&self) -> impl Fn() + Send + Sync + 'static {
        let (runs, owner) = (Arc::clone(&self.runs), self.drops.owner());
        move || {
            let _keep = &owner;
            runs.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The counter, shared: for closures that count runs their own way.
    pub fn counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.runs)
    }

    /// [`bump`]'s user data: the counter.
    pub fn data(&self) -> *mut c_void {
        Arc::as_ptr(&self.runs).cast_mut().cast()
    }

    /// Owners for a launch of [`bump`]: one counted owner and the counter itself.
    pub fn owners(&self) -> (Owner, Arc<AtomicUsize>) {
        (self.drops.owner(), Arc::clone(&self.runs))
    }

    /// The counter's address, as the bytes a bytes launch of a host function hands over.
    pub fn address_bytes(&self) -> [u8; size_of::<usize>()] {
        address_bytes(&self.runs)
    }

    /// How many times it ran.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}
