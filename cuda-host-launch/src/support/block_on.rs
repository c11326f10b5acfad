//! Waiting for one of this crate's futures on the calling thread, with no runtime: for
//! synchronous code and tests ([`Completion::wait`](crate::Completion::wait)).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use crate::support::error::Error;

/// Wakes the waiting thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The blocking wait of a future of this crate (`operation`): refused inside a host function (its
/// driver thread would wait for itself) and on the watcher (which completes the future), else
/// [`block_on`].
pub(crate) fn wait<T, F: Future<Output = Result<T, Error>>>(
    operation: &'static str,
    future: F,
) -> Result<T, Error> {
    crate::support::host_thread::refuse_inside_host_function(operation)?;
    if crate::support::crate_threads::current() == Some(crate::CrateThread::Watcher) {
        return Err(Error::WaitOnWatcher { operation });
    }
    block_on(future)
}

/// Polls `future` on this thread until it is ready, parked in between; its wake unparks it. For
/// this crate's futures only, whose wake comes from the driver's or a poller thread (never from
/// the thread that waits). A spurious unpark only costs one more poll.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}
