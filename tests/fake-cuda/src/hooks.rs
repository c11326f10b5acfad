//! Hooks: a test's function, run at the start of a chosen driver call, on the calling thread,
//! before the call does anything (before an injected fault, too), or at its end, after it did
//! everything but return. A test uses one to make
//! something happen exactly between two driver calls of the code under test: another thread's
//! capture beginning between a capture query and a launch, a context reset during a launch.
//!
//! The hook runs with no lock of the fake held, so it may call the driver itself.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use crate::state::relock;

/// A hook: `f(arg)` at the `nth` call (1-based, counted from when it was set; 0 = every call).
struct Hook {
    nth: u64,
    seen: u64,
    f: extern "C" fn(*mut c_void),
    arg: usize,
}

/// Per (base or export name, after the call).
static HOOKS: LazyLock<Mutex<BTreeMap<(String, bool), Hook>>> = LazyLock::new(Default::default);

/// Sets the hook of `name` (a base symbol: every variant; or an export name), run at the start of
/// the call, or at its end (`after`), replacing an earlier one.
pub(crate) fn set(
    name: &str,
    after: bool,
    nth: u64,
    f: extern "C" fn(*mut c_void),
    arg: *mut c_void,
) {
    relock(&HOOKS).insert(
        (name.to_owned(), after),
        Hook {
            nth,
            seen: 0,
            f,
            arg: arg.expose_provenance(),
        },
    );
}

/// Removes every hook.
pub(crate) fn clear() {
    relock(&HOOKS).clear();
}

/// Runs the hook due at the start (or, `after`, the end) of this call of `export` (a variant of
/// `base`), if any. A hook set for one call is removed once it is due.
pub(crate) fn run(export: &str, base: &str, after: bool) {
    let due = {
        let mut hooks = relock(&HOOKS);
        if hooks.is_empty() {
            return;
        }
        let mut due = None;
        for name in [base, export] {
            let key = (name.to_owned(), after);
            if let Some(hook) = hooks.get_mut(&key) {
                hook.seen += 1;
                if hook.nth == 0 || hook.seen == hook.nth {
                    due = Some((hook.f, hook.arg));
                    if hook.nth != 0 {
                        hooks.remove(&key);
                    }
                    break;
                }
            }
            if base == export {
                break;
            }
        }
        due
    };
    if let Some((f, arg)) = due {
        f(std::ptr::with_exposed_provenance_mut(arg));
    }
}
