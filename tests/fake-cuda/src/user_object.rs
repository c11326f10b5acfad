//! User objects: refcounted host data whose destructor runs on a fake-internal thread once the last
//! reference (the user's, a graph's, an executable graph's or an in-flight launch's) is gone.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use cuda_dl_sys::types::{CUgraph, CUhostFn, CUresult, CUuserObject};

use crate::calls::call;
use crate::errors::{INVALID_HANDLE, INVALID_VALUE, SUCCESS};
use crate::state::{HostFn, State, UserObject, as_ptr, lock, new_handle, notify};

/// User objects created and not yet destroyed (their destructor has not returned yet).
pub(crate) static LIVE: AtomicU64 = AtomicU64::new(0);

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the one flag `cuUserObjectCreate` requires.
const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const MOVE: c_uint = 1;

/// Adds `count` references to each object of `refs` (for instantiation and launches).
pub(crate) fn retain_all(st: &mut State, refs: &[(usize, u32)]) {
    for (object, count) in refs {
        if let Some(o) = st.user_objects.get_mut(object) {
            o.refcount += u64::from(*count);
        }
    }
}

/// Drops `count` references from each object of `refs`.
pub(crate) fn release_all(st: &mut State, refs: &[(usize, u32)]) {
    for (object, count) in refs {
        release(st, *object, *count);
    }
}

/// Drops `count` references; at zero the object is gone and its destructor is queued.
fn release(st: &mut State, object: usize, count: u32) {
    let Some(o) = st.user_objects.get_mut(&object) else {
        return;
    };
    o.refcount = o.refcount.saturating_sub(u64::from(count));
    if o.refcount > 0 {
        return;
    }
    if let Some(o) = st.user_objects.remove(&object) {
        destroy_later(st, o.destroy, o.data);
    }
}

/// Runs `destroy(data)` on the destructor thread, never on the caller's.
fn destroy_later(st: &mut State, destroy: HostFn, data: usize) {
    if st.destructor.is_none() {
        let (sender, receiver) = std::sync::mpsc::channel::<(HostFn, usize)>();
        let spawned = std::thread::Builder::new()
            .name("fake-cuda-user-objects".into())
            .spawn(move || {
                crate::calls::mark_driver_thread();
                for (destroy, data) in receiver {
                    // SAFETY: the user gave `destroy` and its argument to cuUserObjectCreate to
                    // be called once, from a driver thread, when the last reference is gone.
                    unsafe { destroy(as_ptr::<c_void>(data)) };
                    LIVE.fetch_sub(1, Ordering::SeqCst);
                    notify();
                }
            });
        match spawned {
            Ok(_) => st.destructor = Some(sender),
            Err(e) => {
                eprintln!("fake-cuda: cannot start the user-object thread ({e}); leaking");
                return;
            }
        }
    }
    if let Some(sender) = &st.destructor {
        // The receiver lives as long as the thread, which never exits.
        let _ = sender.send((destroy, data));
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuUserObjectCreate(
    object_out: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initialRefcount: c_uint,
    flags: c_uint,
) -> CUresult {
    call("cuUserObjectCreate", "cuUserObjectCreate", || {
        let Some(destroy) = destroy else {
            return INVALID_VALUE;
        };
        if object_out.is_null() || initialRefcount == 0 || flags != NO_DESTRUCTOR_SYNC {
            return INVALID_VALUE;
        }
        let mut st = lock();
        let handle = new_handle();
        st.user_objects.insert(
            handle,
            UserObject {
                data: ptr.expose_provenance(),
                destroy,
                refcount: u64::from(initialRefcount),
            },
        );
        LIVE.fetch_add(1, Ordering::SeqCst);
        // SAFETY: checked non-null; the caller passes a valid place for a handle.
        unsafe { object_out.write(as_ptr(handle)) };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    call("cuUserObjectRetain", "cuUserObjectRetain", || {
        if count == 0 {
            return INVALID_VALUE;
        }
        let mut st = lock();
        match st.user_objects.get_mut(&object.addr()) {
            Some(o) => {
                o.refcount += u64::from(count);
                SUCCESS
            }
            None => INVALID_HANDLE,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    call("cuUserObjectRelease", "cuUserObjectRelease", || {
        if count == 0 {
            return INVALID_VALUE;
        }
        let mut st = lock();
        match st.user_objects.get(&object.addr()) {
            // Releasing more than exists is undefined in the real driver; the fake reports it.
            Some(o) if o.refcount < u64::from(count) => INVALID_VALUE,
            Some(_) => {
                release(&mut st, object.addr(), count);
                SUCCESS
            }
            None => INVALID_HANDLE,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphRetainUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    call("cuGraphRetainUserObject", "cuGraphRetainUserObject", || {
        if count == 0 || flags & !MOVE != 0 {
            return INVALID_VALUE;
        }
        let mut st = lock();
        let (object, graph) = (object.addr(), graph.addr());
        if !st.graphs.contains_key(&graph) {
            return INVALID_HANDLE;
        }
        let Some(o) = st.user_objects.get_mut(&object) else {
            return INVALID_HANDLE;
        };
        if flags & MOVE == 0 {
            o.refcount += u64::from(count);
        }
        if let Some(g) = st.graphs.get_mut(&graph) {
            *g.user_objects.entry(object).or_insert(0) += count;
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphReleaseUserObject(
    graph: CUgraph,
    object: CUuserObject,
    count: c_uint,
) -> CUresult {
    call(
        "cuGraphReleaseUserObject",
        "cuGraphReleaseUserObject",
        || {
            if count == 0 {
                return INVALID_VALUE;
            }
            let mut st = lock();
            let object = object.addr();
            let Some(g) = st.graphs.get_mut(&graph.addr()) else {
                return INVALID_HANDLE;
            };
            let Some(owned) = g.user_objects.get_mut(&object) else {
                return INVALID_VALUE;
            };
            if *owned < count {
                return INVALID_VALUE;
            }
            *owned -= count;
            if *owned == 0 {
                g.user_objects.remove(&object);
            }
            release(&mut st, object, count);
            SUCCESS
        },
    )
}
