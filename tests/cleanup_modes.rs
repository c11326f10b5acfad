//! Who releases the owners of host functions that have run: the reaper thread (the default), or, in
//! manual mode, whoever calls the next launch, `drain` or `flush`, on their own thread. The mode is
//! chosen once per process (`Config::cleanup_mode`, installed before the first launch, which
//! `CUDA_HOST_LAUNCH_CLEANUP` overrides), and a flush that an owner's blocking `Drop` holds up times out. Whoever releases, a
//! batch is released oldest first. Each test has a process of its own.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_host_launch::{
    CLEANUP_MODE_ENV, CleanupMode, Config, Error, Graph, Stream, add_host_node, cleanup_stats,
    config, drain, flush, host_launch, release_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    Drops, Hold, Owner, PATIENCE, REAPER_NAME, ThreadInfo, fake, fake_primary_context,
    thread_states, threads_named, wait_until,
};

/// Launches a closure owning `owner` on `stream` and waits until it has run.
fn run_with(stream: &Stream, owner: Owner) {
    host_launch(stream, move || {
        let _keep = &owner;
    })
    .unwrap();
    stream.synchronize().unwrap();
}

/// The last `n` drops of `drops` happened on this thread.
#[track_caller]
fn assert_dropped_here(drops: &Drops, n: usize) {
    let me = ThreadInfo::current();
    let records = drops.records();
    assert_eq!(records.len(), n, "{records:?}");
    assert!(records.iter().all(|r| r.thread.same_as(&me)), "{records:?}");
}

/// Launches a closure owning `owner` on `stream` behind a hold, so it cannot run (and be queued)
/// before the launch's own drain; returns the hold.
fn launch_held(stream: &Stream, owner: Owner) -> Hold<'static> {
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    host_launch(stream, move || {
        let _keep = &owner;
    })
    .unwrap();
    hold
}

/// Lets `hold` go and waits for `stream`.
fn finish(stream: &Stream, hold: Hold) {
    hold.release();
    stream.synchronize().unwrap();
}

/// An owner that writes its number into a shared log when it is dropped.
struct Numbered(usize, Arc<Mutex<Vec<usize>>>);

impl Drop for Numbered {
    fn drop(&mut self) {
        self.1.lock().unwrap().push(self.0);
    }
}

/// How many launches of the batch below: 8 host functions, then 8 more host functions or releases
/// through events.
const BATCH: usize = 16;

/// Enqueues on `stream` the owners `0..BATCH` in that order (host functions, then, with `events`,
/// releases after events; they complete in stream order). In reaper mode the event poller releases
/// what it completes itself, so only host functions reach the reaper's queue.
fn enqueue_numbered(stream: &Stream, log: &Arc<Mutex<Vec<usize>>>, events: bool) {
    let host_functions = if events { BATCH / 2 } else { BATCH };
    for i in 0..host_functions {
        let owner = Numbered(i, Arc::clone(log));
        host_launch(stream, move || {
            let _keep = &owner;
        })
        .unwrap();
    }
    for i in host_functions..BATCH {
        release_after(stream, Numbered(i, Arc::clone(log))).unwrap();
    }
}

/// Waits (bounded) until `BATCH` records more than `before` are queued for release, and checks
/// that none of the numbered owners was released yet: one batch, queued in the order its
/// launches completed.
fn wait_for_the_batch(before: u64, log: &Mutex<Vec<usize>>) {
    wait_until("the batch to be queued", PATIENCE, || {
        cleanup_stats().queued - before == BATCH as u64
    });
    assert!(
        log.lock().unwrap().is_empty(),
        "released before the batch was whole"
    );
}

/// In manual mode the owners of a host function that has run are dropped by the next launch, by
/// `drain` and by `flush`, each on the calling thread, and not before.
fn manual_mode_releases_on_the_callers_thread() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let drops = Drops::new();

    let hold = launch_held(&stream, drops.owner());
    finish(&stream, hold);
    assert_eq!(drops.dropped(), 0, "released without anyone draining");
    let stats = cleanup_stats();
    assert_eq!(stats.queued, stats.released + 1);

    // The next launch drains what has run.
    let hold = launch_held(&stream, drops.owner());
    assert_dropped_here(&drops, 1);
    finish(&stream, hold);
    assert_eq!(drops.dropped(), 1);

    // `drain` releases what has run, here, and says how many.
    assert_eq!(drain(), 1);
    assert_dropped_here(&drops, 2);
    assert_eq!(drain(), 0);

    // So does `flush`.
    let hold = launch_held(&stream, drops.owner());
    finish(&stream, hold);
    assert_eq!(drops.dropped(), 2);
    flush(PATIENCE).unwrap();
    assert_dropped_here(&drops, 3);
    assert_eq!(drops.live(), 0);
    let stats = cleanup_stats();
    assert_eq!(stats.queued, stats.released);

    assert_eq!(
        threads_named(REAPER_NAME),
        0,
        "a reaper thread exists in manual mode"
    );
}

isolated_test! {
    /// `CUDA_HOST_LAUNCH_CLEANUP=manual`: no reaper thread ever exists, and owners are dropped by
    /// the next launch, `drain` or `flush`, on the caller's thread.
    fn manual_mode_from_the_environment_has_no_reaper_and_releases_on_the_callers_thread(
        CUDA_HOST_LAUNCH_CLEANUP = "manual"
    ) {
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Manual);
        manual_mode_releases_on_the_callers_thread();
        // Graph host nodes too: the owners go when the graph does, at the next drain.
        let graph = Graph::new().unwrap();
        let drops = Drops::new();
        let owner = drops.owner();
        add_host_node(&graph, &[], move || {
            let _keep = &owner;
        })
        .unwrap();
        drop(graph);
        let deadline = std::time::Instant::now() + PATIENCE;
        while drops.dropped() == 0 {
            // The fake destroys user objects on a thread of its own, a little later.
            assert!(std::time::Instant::now() < deadline, "the graph's owners were never released");
            drain();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_dropped_here(&drops, 1);
        assert_eq!(threads_named(REAPER_NAME), 0);
    }

    /// `CUDA_HOST_LAUNCH_CLEANUP=reaper`, in any case and with spaces around, is reaper mode, and
    /// the reaper drops the owners. (Mutation testing: nothing checked this value's spelling.)
    fn reaper_mode_from_the_environment_by_name(CUDA_HOST_LAUNCH_CLEANUP = " Reaper ") {
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Reaper);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        run_with(&stream, drops.owner());
        let records = drops.wait_dropped(1);
        assert!(records.iter().all(|r| r.thread.is_reaper()), "{records:?}");
    }

    /// Once the queue is empty the reaper sleeps (lingering between looks, then parked), rather
    /// than spinning: the scheduler sees it sleeping. (Mutation testing: with the reaper never
    /// allowed to park, it looked at the empty queue without pause, a busy core for good.)
    fn the_idle_reaper_sleeps() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        run_with(&stream, drops.owner());
        drops.wait_dropped(1);
        // Only the crate's reaper runs in this process (every crate thread's name starts with the
        // same 15 bytes, all `/proc` shows).
        wait_until("the reaper to sleep", PATIENCE, || {
            let states = thread_states(REAPER_NAME);
            !states.is_empty() && states.iter().all(|&state| state == 'S')
        });
    }

    /// An empty (or blank) `CUDA_HOST_LAUNCH_CLEANUP` is the default, reaper mode.
    fn an_empty_cleanup_mode_in_the_environment_is_reaper_mode(CUDA_HOST_LAUNCH_CLEANUP = "  ") {
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Reaper);
    }

    /// `Config::cleanup_mode(Manual)`, installed before the first launch, works like the
    /// environment variable.
    fn manual_mode_can_be_chosen_in_code_before_the_first_launch() {
        Config::new()
            .cleanup_mode(CleanupMode::Manual)
            .install()
            .unwrap();
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Manual);
        manual_mode_releases_on_the_callers_thread();
    }

    /// The environment overrides what the program installed.
    fn the_environment_overrides_the_installed_cleanup_mode(CUDA_HOST_LAUNCH_CLEANUP = "Manual") {
        Config::new()
            .cleanup_mode(CleanupMode::Reaper)
            .install()
            .unwrap();
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Manual);
        manual_mode_releases_on_the_callers_thread();
    }

    /// The first launch fixes the configuration (the defaults, reaper mode): a later install is
    /// refused with `AlreadyConfigured` and changes nothing; the reaper keeps working. A second
    /// install after a first one is refused the same way.
    fn the_first_launch_fixes_the_configuration() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        run_with(&stream, drops.owner());
        // Once it has dropped an owner, the reaper has surely named itself.
        drops.wait_dropped(1);
        assert_eq!(threads_named(REAPER_NAME), 1);
        assert!(matches!(
            Config::new().cleanup_mode(CleanupMode::Manual).install(),
            Err(Error::AlreadyConfigured)
        ));
        assert!(matches!(
            Config::new().install(),
            Err(Error::AlreadyConfigured)
        ));
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Reaper);
        run_with(&stream, drops.owner());
        let records = drops.wait_dropped(2);
        assert!(records.iter().all(|r| r.thread.is_reaper()), "{records:?}");
        assert_eq!(threads_named(REAPER_NAME), 1);
    }

    /// An install fixes the configuration too: a second one is refused.
    fn a_second_install_is_refused() {
        Config::new()
            .cleanup_mode(CleanupMode::Manual)
            .install()
            .unwrap();
        assert!(matches!(
            Config::new().cleanup_mode(CleanupMode::Reaper).install(),
            Err(Error::AlreadyConfigured)
        ));
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Manual);
    }

    /// An unknown `CUDA_HOST_LAUNCH_CLEANUP` fails the first launch (and `add_host_node`) with
    /// `InvalidEnvironment`, its owners handed back (dropped here), and `install` as well
    /// (the environment overrides the program): nothing runs with a setting nobody asked for.
    fn an_invalid_cleanup_mode_in_the_environment_fails_the_first_launch(
        CUDA_HOST_LAUNCH_CLEANUP = "sometimes"
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let check = |result: Result<(), Error>| match result {
            Err(Error::InvalidEnvironment {
                variable, value, ..
            }) => {
                assert_eq!(variable, CLEANUP_MODE_ENV);
                assert_eq!(value, "sometimes");
            }
            other => panic!("expected InvalidEnvironment, got {other:?}"),
        };
        check(config().map(|_| ()));
        let drops = Drops::new();
        let owner = drops.owner();
        // Each refusal hands its owner back; taken for an `Error` (as `?` would), it is dropped
        // here.
        check(host_launch(&stream, move || {
            let _keep = &owner;
        }).map_err(Into::into));
        let graph = Graph::new().unwrap();
        let owner = drops.owner();
        check(add_host_node(&graph, &[], move || {
            let _keep = &owner;
        }).map(|_| ()).map_err(Into::into));
        assert_dropped_here(&drops, 2);
        assert!(graph.nodes().unwrap().is_empty());
        check(Config::new().cleanup_mode(CleanupMode::Reaper).install());
        check(config().map(|_| ()));
        assert_eq!(threads_named(REAPER_NAME), 0);
    }

    /// While an owner's `Drop` blocks the reaper, `flush` times out with `FlushTimedOut` counting
    /// it (and later ones); once unblocked, `flush` succeeds and later owners are dropped.
    fn flush_times_out_while_an_owner_drop_blocks_and_succeeds_once_unblocked() {
        struct Blocking(mpsc::Receiver<()>);
        impl Drop for Blocking {
            fn drop(&mut self) {
                let _ = self.0.recv_timeout(PATIENCE);
            }
        }
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (unblock, blocked) = mpsc::channel();
        let blocking = Blocking(blocked);
        host_launch(&stream, move || {
            let _keep = &blocking;
        })
        .unwrap();
        let drops = Drops::new();
        run_with(&stream, drops.owner());

        let timeout = Duration::from_millis(50);
        match flush(timeout) {
            Err(Error::FlushTimedOut { waiting, timeout: t }) => {
                assert!(waiting >= 1, "waiting {waiting}");
                assert_eq!(t, timeout);
            }
            other => panic!("expected FlushTimedOut, got {other:?}"),
        }
        assert!(matches!(flush(Duration::ZERO), Err(Error::FlushTimedOut { .. })));

        unblock.send(()).unwrap();
        flush(PATIENCE).unwrap();
        let records = drops.wait_dropped(1);
        assert!(records[0].thread.is_reaper());
        let stats = cleanup_stats();
        assert_eq!(stats.queued, stats.released);

        run_with(&stream, drops.owner());
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 2);
    }

    /// A drain takes the queue's records as one batch and releases it oldest first: owners are
    /// dropped in the order their launches completed. (The queue is a stack taken whole; a batch
    /// released newest first dropped them in reverse.)
    fn a_drain_releases_its_batch_oldest_first(CUDA_HOST_LAUNCH_CLEANUP = "manual") {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let log: Arc<Mutex<Vec<usize>>> = Arc::default();
        let before = cleanup_stats().queued;
        // Held, so that no launch's own drain finds anything to release.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        enqueue_numbered(&stream, &log, true);
        hold.release();
        stream.synchronize().unwrap();
        wait_for_the_batch(before, &log);
        assert_eq!(drain(), BATCH as u64);
        assert_eq!(*log.lock().unwrap(), (0..BATCH).collect::<Vec<_>>(), "drop order");
    }

    /// `flush` waits for a batch that another thread is still releasing, even when records
    /// queued after it began are released first. A drain took an owner whose `Drop` blocks; the
    /// flush's own drains then release a launch that completed after the flush began. (Counting
    /// records let that later record stand in for the blocked one: `flush` returned `Ok` with the
    /// blocked owner still alive.)
    fn flush_waits_for_a_batch_another_drain_is_still_releasing(
        CUDA_HOST_LAUNCH_CLEANUP = "manual"
    ) {
        struct Blocking(mpsc::Sender<()>, mpsc::Receiver<()>);
        impl Drop for Blocking {
            fn drop(&mut self) {
                let _ = self.0.send(());
                let _ = self.1.recv_timeout(PATIENCE);
            }
        }
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let later = Stream::new(&context).unwrap();
        let (entered, in_drop) = mpsc::channel();
        let (go, wait_for_go) = mpsc::channel();
        let blocking = Blocking(entered, wait_for_go);
        // Held, so that the launch's own drain cannot take it: the drainer below does.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        host_launch(&stream, move || {
            let _keep = &blocking;
        })
        .unwrap();
        finish(&stream, hold);
        let drainer = std::thread::spawn(drain);
        in_drop.recv_timeout(PATIENCE).expect("the drain dropped the blocking owner");

        // A launch that completes only once the flush has begun.
        let drops = Drops::new();
        let hold = launch_held(&later, drops.owner());
        let (result, flushed) = mpsc::channel();
        let flusher = std::thread::spawn(move || {
            let _ = result.send(flush(Duration::from_millis(400)));
        });
        std::thread::sleep(Duration::from_millis(50));
        finish(&later, hold);
        let flushed = flushed.recv_timeout(PATIENCE).expect("the flush returned");
        assert!(
            matches!(flushed, Err(Error::FlushTimedOut { .. })),
            "flush returned {flushed:?} while another drain was still dropping an owner"
        );
        go.send(()).unwrap();
        assert_eq!(drainer.join().unwrap(), 1);
        flusher.join().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1);
    }

    /// The reaper releases a batch oldest first too: an owner whose `Drop` blocks keeps the reaper
    /// while the next launches complete, so that it takes them as one batch once let go.
    fn the_reaper_releases_its_batch_oldest_first() {
        struct Blocking(mpsc::Sender<()>, mpsc::Receiver<()>);
        impl Drop for Blocking {
            fn drop(&mut self) {
                let _ = self.0.send(());
                let _ = self.1.recv_timeout(PATIENCE);
            }
        }
        assert_eq!(config().unwrap().cleanup(), CleanupMode::Reaper);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (entered, in_drop) = mpsc::channel();
        let (go, wait_for_go) = mpsc::channel();
        let blocking = Blocking(entered, wait_for_go);
        host_launch(&stream, move || {
            let _keep = &blocking;
        })
        .unwrap();
        in_drop.recv_timeout(PATIENCE).expect("the reaper dropped the blocking owner");
        let log: Arc<Mutex<Vec<usize>>> = Arc::default();
        let before = cleanup_stats().queued;
        enqueue_numbered(&stream, &log, false);
        stream.synchronize().unwrap();
        wait_for_the_batch(before, &log);
        go.send(()).unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(*log.lock().unwrap(), (0..BATCH).collect::<Vec<_>>(), "drop order");
    }
}
