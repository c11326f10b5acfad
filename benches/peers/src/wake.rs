//! Wakers and executors of the benchmark's own: a waker that stamps the time it is woken, a
//! thread-parking `block_on`, and a one-thread executor for many tasks. Nothing here belongs to a
//! library under test, so every library's future is driven the same way.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A boxed future of a library's completion.
pub type BoxFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Nanoseconds since the first call (never 0 after it).
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    base.elapsed().as_nanos() as u64 + 1
}

/// Waits until `deadline`: sleeps while more than 200 µs are left, then spins (a precise end
/// without a core spinning through long holds).
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep(left - Duration::from_micros(150));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// A waker that records when it is first woken.
pub struct StampWaker {
    pub stamp: AtomicU64,
}

impl Wake for StampWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self
            .stamp
            .compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A waker that unparks a thread.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker for the calling thread: waking it unparks this thread.
pub fn thread_waker() -> Waker {
    Waker::from(Arc::new(ThreadWaker(std::thread::current())))
}

/// Polls `future` once with `waker`.
pub fn poll_with(future: &mut BoxFuture, waker: &Waker) -> Poll<Result<(), String>> {
    future.as_mut().poll(&mut Context::from_waker(waker))
}

/// Parks the calling thread until `future` (already polled once with `waker`, the thread's own)
/// is ready, polling it after each unpark; an error after `timeout`.
pub fn park_until_ready(
    future: &mut BoxFuture,
    waker: &Waker,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("not woken within {timeout:?}"));
        }
        std::thread::park_timeout(deadline - now);
        if let Poll::Ready(result) = poll_with(future, waker) {
            return result;
        }
    }
}

struct Queue {
    ready: Mutex<VecDeque<usize>>,
    thread: Thread,
}

struct TaskWaker {
    index: usize,
    queued: AtomicBool,
    queue: Arc<Queue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue.ready.lock().unwrap().push_back(self.index);
            self.queue.thread.unpark();
        }
    }
}

/// Runs `tasks` to completion on the calling thread, polling each when its waker fires (the
/// thread parks while none is ready). The first error ends the run; so does `timeout`.
pub fn run_all(tasks: Vec<BoxFuture>, timeout: Duration) -> Result<(), String> {
    let queue = Arc::new(Queue {
        ready: Mutex::new((0..tasks.len()).collect()),
        thread: std::thread::current(),
    });
    let wakers: Vec<Arc<TaskWaker>> = (0..tasks.len())
        .map(|index| {
            Arc::new(TaskWaker {
                index,
                queued: AtomicBool::new(true),
                queue: Arc::clone(&queue),
            })
        })
        .collect();
    let mut tasks: Vec<Option<BoxFuture>> = tasks.into_iter().map(Some).collect();
    let mut left = tasks.len();
    let deadline = Instant::now() + timeout;
    while left > 0 {
        let next = queue.ready.lock().unwrap().pop_front();
        let Some(index) = next else {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("{left} tasks not done within {timeout:?}"));
            }
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(100)));
            continue;
        };
        wakers[index].queued.store(false, Ordering::Release);
        let Some(task) = tasks[index].as_mut() else {
            continue;
        };
        let waker = Waker::from(Arc::clone(&wakers[index]));
        if let Poll::Ready(result) = task.as_mut().poll(&mut Context::from_waker(&waker)) {
            result?;
            tasks[index] = None;
            left -= 1;
        }
    }
    Ok(())
}

/// A one-shot signal and the future that waits for it: `fire` (from any thread) resolves it.
#[derive(Default)]
pub struct Signal {
    done: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    /// Resolves the future and wakes its task.
    pub fn fire(&self) {
        self.done.store(true, Ordering::Release);
        if let Some(waker) = self.waker.lock().unwrap().take() {
            waker.wake();
        }
    }

    /// The future of `signal`.
    pub fn future(signal: Arc<Signal>) -> BoxFuture {
        Box::pin(SignalFuture(signal))
    }
}

struct SignalFuture(Arc<Signal>);

impl Future for SignalFuture {
    type Output = Result<(), String>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.0.done.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        *self.0.waker.lock().unwrap() = Some(cx.waker().clone());
        if self.0.done.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}
