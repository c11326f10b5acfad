//! How [`flush`](crate::flush) waits for a poller: it asks for a round and waits until the poller
//! has finished one that began after the ask. A round completes every entry whose stream got there
//! by the time it looks (the callbacks run, the futures woken, the records queued for release), so
//! after a `synchronize` of the streams, a flush returns only once their releases and callbacks
//! are done, whatever the poller's pace.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use crate::support::sync::lock;

/// A poller's rounds, as requests and the newest request served.
pub(crate) struct RoundBarrier {
    /// (requests made, newest request served).
    state: Mutex<(u64, u64)>,
    served: Condvar,
}

impl RoundBarrier {
    pub(crate) const fn new() -> RoundBarrier {
        RoundBarrier {
            state: Mutex::new((0, 0)),
            served: Condvar::new(),
        }
    }

    /// A flush asks for a round; returns the request to wait for.
    pub(crate) fn ask(&self) -> u64 {
        let mut state = lock(&self.state);
        state.0 += 1;
        state.0
    }

    /// The poller, as a round begins: the newest request the round will serve.
    pub(crate) fn round_begins(&self) -> u64 {
        lock(&self.state).0
    }

    /// The poller finished a round that began when `served` was the newest request.
    pub(crate) fn round_done(&self, served: u64) {
        let mut state = lock(&self.state);
        if served > state.1 {
            state.1 = served;
            self.served.notify_all();
        }
    }

    /// The poller stops with nothing pending (or the process exits): every request so far is
    /// served.
    pub(crate) fn stopped(&self) {
        let mut state = lock(&self.state);
        state.1 = state.0;
        self.served.notify_all();
    }

    /// Waits until `request` is served, or `deadline` (`None`: no deadline) passes; whether it
    /// was served.
    pub(crate) fn wait(&self, request: u64, deadline: Option<Instant>) -> bool {
        let mut state = lock(&self.state);
        loop {
            if state.1 >= request {
                return true;
            }
            let wait = match deadline {
                None => std::time::Duration::from_millis(10),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    (deadline - now).min(std::time::Duration::from_millis(10))
                }
            };
            state = self
                .served
                .wait_timeout(state, wait)
                .map_or_else(|p| p.into_inner().0, |(guard, _)| guard);
        }
    }
}
