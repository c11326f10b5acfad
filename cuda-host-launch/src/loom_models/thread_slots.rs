//! The event side's hand-over (`support/thread_slots.rs`): its wake-up and its stop, on the
//! library's own [`Handover`].
//!
//! - **Wake-up.** The watcher looks (`take_entries`), then asks to be woken (`ask_to_be_woken`)
//!   and parks if no entry waits; an enqueuing thread hands over under its slot's lock and wakes
//!   the watcher if it asked (`take_wake`). A lost wake-up leaves the watcher parked with entries
//!   handed over: every thread ends up blocked, and loom reports the deadlock.
//! - **Stop.** The watcher decides to stop under every slot's lock (`with_all_locked`) if no entry
//!   waits; a thread hands over and looks whether a watcher runs under its slot's lock. Every
//!   entry is either taken by the watcher or handed over by a thread that saw it stopped (and
//!   starts the next one): none is left behind.

use loom::sync::Notify;

use super::*;
use crate::support::sync::AtomicBool;
use crate::support::thread_slots::{Handover, Slot};

/// Hands `entry` over through `slot` as an enqueue does; wakes the watcher (`bell`) if it asked.
/// (A `Notify` stands for the thread's park and unpark: loom's `unpark` of a thread blocked on a
/// mutex wakes it from the mutex, which no real thread sees.)
fn enqueue(handover: &Handover<usize, u8>, slot: &Slot<usize, u8>, entry: usize, bell: &Notify) {
    let mut held = slot.lock();
    slot.hand_over(&mut held, entry);
    if handover.take_wake() {
        bell.notify();
    }
}

#[test]
fn loom_thread_slots_an_entry_is_taken_or_wakes_the_watcher() {
    check("thread slots: wake-up", 3, || {
        let handover = Arc::new(Handover::<usize, u8>::new());
        let bell = Arc::new(Notify::new());
        let total = 2;
        let watcher = {
            let (handover, bell) = (Arc::clone(&handover), Arc::clone(&bell));
            thread::spawn(move || {
                let mut taken = Vec::new();
                loop {
                    handover.looking();
                    handover.take_entries(&mut Vec::new(), |entries| taken.append(entries));
                    if taken.len() == total {
                        return taken;
                    }
                    if handover.ask_to_be_woken() {
                        bell.wait();
                    }
                }
            })
        };
        let producers: Vec<_> = (0..total)
            .map(|i| {
                let (handover, bell) = (Arc::clone(&handover), Arc::clone(&bell));
                thread::spawn(move || {
                    let slot = handover.register();
                    enqueue(&handover, &slot, i, &bell);
                })
            })
            .collect();
        for producer in producers {
            producer.join().unwrap();
        }
        let mut taken = watcher.join().unwrap();
        taken.sort_unstable();
        assert_eq!(taken, vec![0, 1]);
    });
}

#[test]
fn loom_thread_slots_no_entry_is_left_behind_by_a_stop() {
    check("thread slots: stop", 3, || {
        let handover = Arc::new(Handover::<usize, u8>::new());
        let running = Arc::new(AtomicBool::new(true));
        let slot = handover.register();
        let producer = {
            let running = Arc::clone(&running);
            thread::spawn(move || {
                let mut held = slot.lock();
                slot.hand_over(&mut held, 7);
                // Under the slot's lock, as `bell::ring_events`: a stopped watcher means this
                // thread starts the next one, which takes the entry.
                !running.load(Ordering::Acquire)
            })
        };
        let mut taken = Vec::new();
        handover.take_entries(&mut Vec::new(), |entries| taken.append(entries));
        let stopped = handover.with_all_locked(|slots| {
            let idle = slots.no_entries();
            if idle {
                running.store(false, Ordering::Release);
            }
            idle
        });
        let starts_next = producer.join().unwrap();
        if stopped && !starts_next {
            assert_eq!(taken, vec![7], "the entry was left behind by the stop");
        }
        if !stopped {
            assert!(taken.is_empty());
        }
    });
}
