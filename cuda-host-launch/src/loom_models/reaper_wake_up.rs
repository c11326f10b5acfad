//! The reaper's wake-up protocol, on the library's own [`CleanupQueue`] (`reaper/queue.rs`): its
//! `push` (a driver thread's), `reaper_may_park` (the reaper's last look before it parks),
//! `take_all` and `set_reaper` (the reaper's start).
//!
//! A lost wake-up leaves the reaper parked with records queued, for good: every later push finds
//! the queue non-empty and wakes no one. The models end the reaper once it has released every
//! record; if it can stay parked, every thread ends up blocked and loom reports a deadlock, which
//! fails the model.
//!
//! The reaper here is `reaper/thread.rs`'s loop without what loom cannot model (the clock, the
//! sleeps, the process-wide pool and exit gate): it looks with `reaper_may_park`, lingers `linger`
//! looks (a yield for each poll interval), then parks; when it finds records, it takes them all.

use super::*;
use crate::reaper::queue::CleanupQueue;

/// A queue shared by the model's threads.
struct Queue(CleanupQueue<Node>);

// SAFETY: the queue is made for concurrent use: a node's ownership passes from its producer to the
// queue to one consumer, with Release/Acquire ordering between them (which these models check).
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

/// Makes node (`producer`, `seq`) and pushes it with the queue's own `push` (which wakes the
/// reaper if the queue was empty); returns whether the queue was empty.
fn push_new(queue: &Queue, producer: usize, seq: usize) -> bool {
    // SAFETY: a fresh node, pushed once; the queue owns it until a consumer takes it.
    unsafe { queue.0.push(new_node(producer, seq)) }
}

/// The reaper: looks, lingers `linger` looks, parks; takes whatever it finds. Returns once it has
/// taken `total` nodes.
fn reaper(queue: &Queue, linger: usize, total: usize) -> Vec<Vec<Taken>> {
    let mut batches = Vec::new();
    let mut released = 0;
    let mut idle = 0;
    loop {
        if queue.0.reaper_may_park() {
            if idle < linger {
                idle += 1;
                thread::yield_now();
                continue;
            }
            idle = 0;
            thread::park();
            continue;
        }
        idle = 0;
        let batch = take_nodes(queue.0.take_all());
        released += batch.len();
        batches.push(batch);
        if released == total {
            return batches;
        }
    }
}

/// A running reaper (its handle published before any push) and producers pushing
/// `per_producer[p]` records each.
fn steady_state(per_producer: &'static [usize], linger: usize) {
    let queue = Arc::new(Queue(CleanupQueue::new()));
    let total = per_producer.iter().sum();
    let reaper = {
        let queue = Arc::clone(&queue);
        thread::spawn(move || reaper(&queue, linger, total))
    };
    assert!(queue.0.set_reaper(reaper.thread().clone()));
    let producers: Vec<_> = per_producer
        .iter()
        .enumerate()
        .map(|(p, &count)| {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                (0..count)
                    .map(|s| push_new(&queue, p, s))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let pushes: Vec<_> = producers.into_iter().map(|h| h.join().unwrap()).collect();
    let batches = reaper.join().unwrap();
    verify(&pushes, &[batches], &take_nodes(queue.0.take_all()));
}

#[test]
fn loom_no_lost_wake_up_two_producers() {
    check("reaper: parks at once, 2 producers x 2 records", 3, || {
        steady_state(&[2, 2], 0)
    });
}

#[test]
fn loom_no_lost_wake_up_three_producers() {
    check("reaper: parks at once, 3 producers x 1 record", 2, || {
        steady_state(&[1, 1, 1], 0)
    });
}

#[test]
fn loom_no_lost_wake_up_while_lingering() {
    check("reaper: lingers once, 2 producers x 2 records", 2, || {
        steady_state(&[2, 2], 1)
    });
}

/// The reaper starting while a record is pushed (`reaper/thread.rs`: spawn, then `set_reaper`)
/// while an earlier record's host function finishes on the driver's thread. The cleanup mode is
/// fixed for the process now (`Config`), so no launch precedes the reaper's start in reaper mode;
/// the queue keeps this contract all the same, so that its correctness does not rest on that.
/// (Pushes from launches made after the reaper started are ordered after `set_reaper` by the
/// launch itself, so they always see it.)
#[test]
fn loom_a_push_racing_the_reapers_start_wakes_it() {
    check(
        "reaper start: spawn, set_reaper, a push racing it",
        3,
        || {
            let queue = Arc::new(Queue(CleanupQueue::new()));
            let reaper = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || reaper(&queue, 0, 1))
            };
            let driver = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || vec![push_new(&queue, 0, 0)])
            };
            assert!(queue.0.set_reaper(reaper.thread().clone()));
            let pushes = vec![driver.join().unwrap()];
            let batches = reaper.join().unwrap();
            verify(&pushes, &[batches], &take_nodes(queue.0.take_all()));
        },
    );
}
