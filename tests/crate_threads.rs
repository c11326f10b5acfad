//! The crate's one configuration (`Config`): installed once, before the first use, with the
//! environment's overrides; and how the crate starts its own threads (`Config::threads`): their
//! names, the start hook, and
//! where they may run (`Affinity`). A crate thread starts from a user's thread and would inherit
//! its affinity; by default it widens it to the process's CPUs. Each case has a process of its own
//! (the settings and the threads are process-wide), on the fake driver; the affinity cases need
//! two CPUs, and pin the launching thread to the first. Linux only (affinity is set there alone).
#![cfg(target_os = "linux")]

use std::sync::{Arc, Mutex};

use cuda_host_launch::{
    Affinity, Config, CrateThread, Error, POLLER_ENV, PollerSettings, REAPER_LINGER_ENV,
    REAPER_POLL_ENV, Stream, ThreadSettings, config, flush, host_launch, release_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    Drops, PATIENCE, fake, fake_driver_path, fake_primary_context, resolves_within, threads_named,
    wait_until,
};

/// What each crate thread's start hook saw: which thread, and the CPUs it may run on.
type Started = Arc<Mutex<Vec<(CrateThread, Vec<usize>)>>>;

/// The CPUs the calling thread may run on.
fn cpus_of_this_thread() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed is its own.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: an index below the set's size.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` is below its size (a CPU the thread
    // may use); the size passed is its own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// Settings with a start hook that notes each thread and its CPUs into `started`.
fn noting(settings: ThreadSettings, started: &Started) -> ThreadSettings {
    let started = Arc::clone(started);
    settings.on_start(move |which| {
        started.lock().unwrap().push((which, cpus_of_this_thread()));
    })
}

/// Installs a configuration with these thread settings (before the crate's first use).
fn install_threads(settings: ThreadSettings) {
    Config::new()
        .threads(settings)
        .install()
        .expect("installed before the crate's first use");
}

/// Installs a start hook that runs `act` on the crate thread `which` as it starts, with a stream
/// of the fake's primary context, then starts the crate's threads (a release on that stream) and
/// returns what `act` returned each time it ran.
fn hook_with_a_stream(
    which: CrateThread,
    act: impl Fn(cuda_host_launch::RawStream) -> String + Send + Sync + 'static,
) -> Vec<String> {
    let stream_for_hook: Arc<Mutex<Option<cuda_host_launch::RawStream>>> = Arc::default();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (hook_stream, sink) = (Arc::clone(&stream_for_hook), Arc::clone(&seen));
    install_threads(ThreadSettings::new().on_start(move |thread| {
        if thread != which {
            return;
        }
        let Some(stream) = *hook_stream.lock().unwrap() else {
            return;
        };
        sink.lock().unwrap().push(act(stream));
    }));
    let stream = Stream::new(&fake_primary_context()).unwrap();
    // SAFETY: the stream outlives every use (the hooks have run once the owner is dropped, and
    // the stream is dropped last).
    *stream_for_hook.lock().unwrap() =
        Some(unsafe { cuda_host_launch::RawStream::from_raw(stream.raw()) });
    let drops = Drops::new();
    release_after(&stream, drops.owner()).unwrap();
    drops.wait_dropped(1);
    flush(PATIENCE).unwrap();
    seen.lock().unwrap().clone()
}

/// Starts the event poller from this thread (a release) and returns the CPUs its start hook saw.
fn event_poller_cpus(started: &Started) -> Vec<usize> {
    let stream = Stream::new(&fake_primary_context()).unwrap();
    let drops = Drops::new();
    release_after(&stream, drops.owner()).unwrap();
    drops.wait_dropped(1);
    let seen = started.lock().unwrap().clone();
    seen.into_iter()
        .find(|(which, _)| *which == CrateThread::Watcher)
        .expect("the event poller's start hook ran")
        .1
}

/// The CPUs this process's threads may use, at least two (else the cases cannot tell affinities
/// apart); the calling thread is then pinned to the first.
fn two_cpus_and_pin_to_the_first() -> Vec<usize> {
    let cpus = cpus_of_this_thread();
    assert!(
        cpus.len() >= 2,
        "the affinity cases need two CPUs; this thread may use {cpus:?}"
    );
    pin_this_thread(cpus[0]);
    assert_eq!(cpus_of_this_thread(), [cpus[0]]);
    cpus
}

isolated_test! {
    /// Threads started after an installed `Config::threads` take its names and run its start
    /// hook once each, first thing; `config` reads the settings back.
    fn crate_threads_take_the_names_and_the_start_hook_set(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let started: Started = Arc::default();
        install_threads(noting(
            ThreadSettings::new().name(|which| match which {
                CrateThread::Reaper => "t-reaper".to_string(),
                CrateThread::Watcher => "t-watch".to_string(),
                _ => "t-other".to_string(),
            }),
            &started,
        ));
        let now = config().unwrap().thread_settings().clone();
        assert!(now.name.is_some() && now.start.is_some(), "{now:?}");
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let drops = Drops::new();
        host_launch(&stream, {
            let owner = drops.owner();
            move || {
                let _keep = &owner;
            }
        })
        .unwrap();
        release_after(&stream, drops.owner()).unwrap();
        let low = cuda_host_launch::CompletionMode::LowLatency.completion(&stream).unwrap();
        drops.wait_dropped(2);
        flush(PATIENCE).unwrap();
        assert_eq!(threads_named("t-reaper"), 1);
        assert_eq!(threads_named("t-watch"), 1);
        assert_eq!(threads_named(CrateThread::Reaper.default_name()), 0);
        // Every crate thread ran the hook once (the watcher once, though it watches both the
        // release's event and the low-latency future's flag).
        let mut which: Vec<CrateThread> =
            started.lock().unwrap().iter().map(|(which, _)| *which).collect();
        which.sort_by_key(|w| format!("{w:?}"));
        assert_eq!(
            which,
            [CrateThread::Reaper, CrateThread::Watcher]
        );
        drop(low);
    }

    /// By default a crate thread may run on every CPU of the process, though the thread that
    /// started it was pinned to one. (Mutation testing: with no placement, or the process's CPUs
    /// read as none or as one, it kept the launcher's single CPU and every test passed.)
    fn a_crate_thread_widens_the_affinity_it_inherits_to_the_process(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cpus = two_cpus_and_pin_to_the_first();
        let started: Started = Arc::default();
        install_threads(noting(ThreadSettings::new(), &started));
        assert_eq!(config().unwrap().thread_settings().affinity, Affinity::Process);
        assert_eq!(event_poller_cpus(&started), cpus);
    }

    /// `Affinity::Inherit` keeps the starting thread's affinity.
    fn a_crate_thread_may_keep_the_affinity_it_inherits(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cpus = two_cpus_and_pin_to_the_first();
        let started: Started = Arc::default();
        install_threads(noting(
            ThreadSettings::new().affinity(Affinity::Inherit),
            &started,
        ));
        assert_eq!(event_poller_cpus(&started), [cpus[0]]);
    }

    /// `Affinity::Cpus` pins a crate thread to the CPUs named that the process may use; a CPU it
    /// may not use is left out. (Mutation testing: with the filter's `||` as `&&`, or the set's
    /// index test reversed, the thread kept the launcher's CPU.)
    fn a_crate_thread_may_be_pinned_to_cpus_the_process_may_use(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cpus = two_cpus_and_pin_to_the_first();
        let started: Started = Arc::default();
        let outside = (0..).find(|c| !cpus.contains(c)).unwrap();
        install_threads(noting(
            ThreadSettings::new().affinity(Affinity::Cpus(vec![cpus[1], outside])),
            &started,
        ));
        assert_eq!(event_poller_cpus(&started), [cpus[1]]);
    }

    /// A start hook that calls `flush` on the event poller gets `FlushOnCrateThread` at once (it
    /// would wait for its own thread), and the poller then completes event work as usual. (Before:
    /// the flush waited for the poller's round, which its own thread was to run: `FlushTimedOut`
    /// after the whole timeout, or for ever with `Duration::MAX`, and no event work completed
    /// meanwhile.)
    fn a_start_hook_that_flushes_gets_an_error_at_once_and_stalls_nothing(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let seen: Arc<Mutex<Vec<(CrateThread, String, std::time::Duration)>>> = Arc::default();
        let sink = Arc::clone(&seen);
        install_threads(ThreadSettings::new().on_start(move |which| {
            let began = std::time::Instant::now();
            let result = flush(std::time::Duration::from_secs(3));
            sink.lock().unwrap().push((which, format!("{result:?}"), began.elapsed()));
        }));
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        flush(PATIENCE).unwrap();
        let seen = seen.lock().unwrap();
        assert!(!seen.is_empty());
        for (which, result, took) in seen.iter() {
            assert!(
                result.starts_with("Err(FlushOnCrateThread"),
                "{which:?}'s hook: {result} after {took:?}"
            );
            assert!(*took < std::time::Duration::from_secs(1), "{which:?}'s hook waited {took:?}");
        }
    }

    /// A watcher's start hook that waits for a future of this crate (`Completion::wait`) gets
    /// `WaitOnWatcher` at once: the watcher completes that future, so it would wait for itself,
    /// and every release and future of the process with it. Event work then completes as usual.
    /// (Before: the hook waited for ever, and no event work completed again.)
    fn a_watchers_start_hook_that_waits_for_a_future_gets_an_error_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let seen = hook_with_a_stream(CrateThread::Watcher, |stream| {
            let result = cuda_host_launch::CompletionMode::Event
                .completion(stream)
                .map(cuda_host_launch::Completion::wait);
            format!("{result:?}")
        });
        assert_eq!(
            seen.as_slice(),
            ["Ok(Err(WaitOnWatcher { operation: \"Completion::wait\" }))"]
        );
    }

    /// The reaper's start hook may await a completion of this crate: the watcher resolves it.
    /// (The torture harness's start hooks do this too; its one failure there, seed 4600359, was
    /// the harness's own lock, which the watcher's hook waited for behind a reset.)
    fn a_reapers_start_hook_that_awaits_a_completion_sees_it_resolve(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let seen = hook_with_a_stream(CrateThread::Reaper, |stream| {
            let result = cuda_host_launch::CompletionMode::Event
                .completion(stream)
                .map(|future| resolves_within(future, std::time::Duration::from_secs(5)));
            format!("{result:?}")
        });
        assert_eq!(seen.as_slice(), ["Ok(Some(Ok(())))"]);
    }

    /// In manual mode, a watcher's start hook that drains, or enqueues (whose manual-mode drain
    /// follows), releases nothing there: owners' `Drop` is user code and never runs on the
    /// watcher. (Found by the torture harness's start hooks, seed 4600318: an owner was dropped
    /// on `cuda-hl-watch`.)
    fn in_manual_mode_a_watchers_start_hook_releases_nothing_on_the_watcher(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        CUDA_HOST_LAUNCH_CLEANUP = "manual"
    ) {
        let stream_for_hook: Arc<Mutex<Option<cuda_host_launch::RawStream>>> = Arc::default();
        let drained: Arc<Mutex<Vec<u64>>> = Arc::default();
        let (hook_stream, sink) = (Arc::clone(&stream_for_hook), Arc::clone(&drained));
        install_threads(ThreadSettings::new().on_start(move |which| {
            if which != CrateThread::Watcher {
                return;
            }
            // Once a host function's record is queued (after this thread started).
            wait_until("a record queued", PATIENCE, || {
                let stats = cuda_host_launch::cleanup_stats();
                stats.queued > stats.released
            });
            sink.lock().unwrap().push(cuda_host_launch::drain());
            if let Some(stream) = *hook_stream.lock().unwrap() {
                // An enqueue: in manual mode it drains after the hand-over.
                let _ = cuda_host_launch::CompletionMode::HostFunction.completion(stream);
            }
        }));
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let held = Stream::new(&context).unwrap();
        // SAFETY: the stream outlives every use (the hook has run once the release is done, and
        // the stream is dropped last).
        *stream_for_hook.lock().unwrap() =
            Some(unsafe { cuda_host_launch::RawStream::from_raw(held.raw()) });
        let drops = Drops::new();
        let owner = drops.owner();
        let hold = fake().hold_stream(held.raw()).expect("the fake could not hold the stream");
        host_launch(&held, move || {
            let _keep = &owner;
        })
        .unwrap();
        // Starts the watcher, whose hook waits for the host function's record, then drains and
        // enqueues.
        let released = Drops::new();
        release_after(&stream, released.owner()).unwrap();
        hold.release();
        held.synchronize().unwrap();
        stream.synchronize().unwrap();
        wait_until("the hook's drain", PATIENCE, || !drained.lock().unwrap().is_empty());
        flush(PATIENCE).unwrap();
        assert_eq!(drained.lock().unwrap().as_slice(), [0], "the hook's drain released");
        for record in drops.records().iter().chain(released.records().iter()) {
            assert_ne!(
                record.thread.name.as_deref(),
                Some(CrateThread::Watcher.default_name()),
                "an owner was dropped on the watcher"
            );
        }
        assert_eq!((drops.dropped(), released.dropped()), (1, 1));
    }

    /// A thread-name function is user code: one that calls into the crate (here, an enqueue that
    /// needs the watcher it is naming) must not deadlock. (Before: the crate called it while
    /// holding the lock that starts the watcher, and the enqueue's start of the watcher waited
    /// for that lock on the same thread, for ever.)
    fn a_thread_name_function_may_call_the_crate(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let other: Arc<Mutex<Option<Stream>>> = Arc::default();
        let inner = Drops::new();
        let (for_name, inner_owner) = (Arc::clone(&other), Mutex::new(Some(inner.owner())));
        install_threads(ThreadSettings::new().name(move |which| {
            // Once (the enqueue below starts the watcher, which calls this again), and with no
            // lock of the test's held across the enqueue.
            if which != CrateThread::Watcher {
                return which.default_name().to_string();
            }
            let owner = inner_owner.lock().unwrap().take();
            let stream = for_name.lock().unwrap().as_ref().map(Stream::raw);
            if let (Some(owner), Some(stream)) = (owner, stream) {
                // SAFETY: the stream lives until the end of the test.
                let stream = unsafe { cuda_host_launch::RawStream::from_raw(stream) };
                let _ = release_after(stream, owner);
            }
            which.default_name().to_string()
        }));
        let context = fake_primary_context();
        *other.lock().unwrap() = Some(Stream::new(&context).unwrap());
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let (done, finished) = std::sync::mpsc::channel();
        let owner = drops.owner();
        // SAFETY: the stream outlives the enqueue (waited for below, the stream dropped last).
        let raw = unsafe { cuda_host_launch::RawStream::from_raw(stream.raw()) };
        std::thread::spawn(move || {
            let _ = done.send(release_after(raw, owner).map_err(|e| e.to_string()));
        });
        let launched = finished
            .recv_timeout(PATIENCE)
            .expect("the enqueue that starts the watcher returned (no deadlock)");
        assert!(launched.is_ok(), "{launched:?}");
        drops.wait_dropped(1);
        inner.wait_dropped(1);
        flush(PATIENCE).unwrap();
        drop(other.lock().unwrap().take());
    }

    /// A `LowLatency` future whose context is reset after it was registered but before the
    /// watcher that will watch it runs (here: from the watcher's name function, which runs in
    /// that window) fails with the reset, without a flush. (Before: the reset's reclaim told no
    /// one, since no watcher ran; the watcher then took the registration and waited for a flag
    /// that a reset context never writes, until a flush or a later reclaim.)
    fn a_low_latency_future_whose_context_is_reset_before_its_watcher_runs_fails(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let driver = cuda_workspace::testing::load_fake_driver();
        let to_reset: Arc<Mutex<Option<Arc<cuda_host_launch::PrimaryContext>>>> =
            Arc::new(Mutex::new(Some(Arc::clone(&context))));
        let hold_for_name: Arc<Mutex<Option<cuda_workspace::testing::Hold<'static>>>> =
            Arc::default();
        let (for_name, hold_there) = (Arc::clone(&to_reset), Arc::clone(&hold_for_name));
        install_threads(ThreadSettings::new().name(move |which| {
            if which == CrateThread::Watcher {
                let context = for_name.lock().unwrap().take();
                let hold = hold_there.lock().unwrap().take();
                if let (Some(context), Some(hold)) = (context, hold) {
                    // The flag write never runs: held until a sticky error discards the
                    // stream's work.
                    fake().poison_context(context.raw()).unwrap();
                    hold.release();
                    // SAFETY: nothing of the context is used after this (its raw stream is
                    // leaked, never destroyed).
                    unsafe { context.reset() }.unwrap();
                }
            }
            which.default_name().to_string()
        }));
        let mut raw = std::ptr::null_mut();
        context.set_current().unwrap();
        // SAFETY: a valid out-pointer; the context is current.
        unsafe { driver.cuStreamCreate(&mut raw, 0) }.unwrap();
        // SAFETY: a live stream, never destroyed (the reset takes it).
        let stream = unsafe { cuda_host_launch::RawStream::from_raw(raw) };
        *hold_for_name.lock().unwrap() =
            Some(fake().hold_stream(raw).expect("the fake could not hold the stream"));
        let future = cuda_host_launch::CompletionMode::LowLatency
            .completion(stream)
            .unwrap();
        assert!(to_reset.lock().unwrap().is_none(), "the watcher was named");
        let resolved = resolves_within(future, std::time::Duration::from_secs(3));
        assert!(
            matches!(
                resolved,
                Some(Err(Error::ContextLost | Error::DeviceFault { .. }))
            ),
            "{resolved:?}"
        );
    }

    /// A watcher's start hook that panics is reported on the lane (the reaper), not on the
    /// watcher: the panic handler is user code. (Before: the handler ran on `cuda-hl-watch`.)
    fn a_watchers_start_hook_panic_is_reported_on_the_lane(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        cuda_workspace::testing::quiet_expected_panics(|message| message == "the hook panicked");
        type Seen = (cuda_host_launch::PanicOrigin, String, Option<String>);
        let threads: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sink = Arc::clone(&threads);
        cuda_host_launch::set_panic_handler(move |report| {
            sink.lock().unwrap().push((
                report.origin,
                report.message.to_string(),
                std::thread::current().name().map(String::from),
            ));
        });
        install_threads(ThreadSettings::new().on_start(|which| {
            if which == CrateThread::Watcher {
                panic!("the hook panicked");
            }
        }));
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        flush(PATIENCE).unwrap();
        let threads = threads.lock().unwrap();
        assert_eq!(
            threads.as_slice(),
            [(
                cuda_host_launch::PanicOrigin::StartHook,
                "the hook panicked".to_string(),
                Some(CrateThread::Reaper.default_name().to_string())
            )]
        );
    }

    /// A start hook that panics with a payload whose own `Drop` panics: the panic is reported
    /// (`PanicOrigin::StartHook`), the payload's panic goes no further, and the crate's threads
    /// run on: a release completes and `flush` returns. (Before: the payload was dropped outside
    /// any `catch_unwind`, its panic ended the poller's thread, which stayed registered: event work
    /// stayed pending and `flush` timed out.)
    fn a_start_hooks_panic_whose_payload_panics_on_drop_stops_no_thread(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        struct PanicsOnDrop;
        impl Drop for PanicsOnDrop {
            fn drop(&mut self) {
                panic!("the hook's payload panicked on drop");
            }
        }
        cuda_workspace::testing::quiet_expected_panics(|message| {
            message.contains("panicked on drop") || message == "<non-string panic>"
        });
        let reports: Arc<Mutex<Vec<cuda_host_launch::PanicOrigin>>> = Arc::default();
        let sink = Arc::clone(&reports);
        cuda_host_launch::set_panic_handler(move |report| sink.lock().unwrap().push(report.origin));
        install_threads(ThreadSettings::new().on_start(|_| {
            std::panic::panic_any(PanicsOnDrop);
        }));
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        flush(PATIENCE).unwrap();
        let reports = reports.lock().unwrap();
        assert!(
            reports.iter().all(|o| *o == cuda_host_launch::PanicOrigin::StartHook)
                && reports.len() >= 2,
            "{reports:?}"
        );
    }

    /// The defaults, fixed by the first read, are what `Config::new` says; the default names are
    /// distinct within the 15 bytes Linux shows of a thread's name.
    fn the_defaults_are_in_force_when_nothing_was_installed() {
        let config = config().unwrap();
        assert_eq!(config.event_poller_settings(), PollerSettings::DEFAULT);
        assert_eq!(
            config.reaper_waits(),
            (std::time::Duration::from_micros(50), std::time::Duration::from_millis(2))
        );
        assert_eq!(config.cleanup(), cuda_host_launch::CleanupMode::Reaper);
        let shown: Vec<&str> = [CrateThread::Reaper, CrateThread::Watcher]
            .iter()
            .map(|t| &t.default_name()[..t.default_name().len().min(15)])
            .collect();
        assert!(shown.iter().all(|name| name.len() <= 15), "{shown:?}");
        assert_eq!(
            shown.iter().collect::<std::collections::HashSet<_>>().len(),
            2,
            "{shown:?}"
        );
        assert!(matches!(Config::new().install(), Err(Error::AlreadyConfigured)));
    }

    /// The environment's overrides: the event poller's pace and the reaper's, over what the
    /// program installed.
    fn the_environment_overrides_the_paces(
        CUDA_HOST_LAUNCH_POLLER = " Low-Latency ",
        CUDA_HOST_LAUNCH_REAPER_POLL_US = "7",
        CUDA_HOST_LAUNCH_REAPER_LINGER_US = "900",
    ) {
        Config::new()
            .event_poller(PollerSettings::DEFAULT)
            .reaper_pace(std::time::Duration::from_micros(1), std::time::Duration::from_micros(2))
            .install()
            .unwrap();
        let config = config().unwrap();
        assert_eq!(config.event_poller_settings(), PollerSettings::LOW_LATENCY);
        assert_eq!(
            config.reaper_waits(),
            (std::time::Duration::from_micros(7), std::time::Duration::from_micros(900))
        );
    }

    /// `default` in the environment puts the default pace back over what the program installed.
    /// (Mutation testing: with that value's arm deleted, it was taken for a value not
    /// understood.)
    fn the_environment_may_ask_for_the_default_pace(CUDA_HOST_LAUNCH_POLLER = "default") {
        Config::new()
            .event_poller(PollerSettings::LOW_LATENCY)
            .install()
            .unwrap();
        assert_eq!(config().unwrap().event_poller_settings(), PollerSettings::DEFAULT);
    }

    /// The watcher paces its event side as installed: with pauses of 10 s between looks and no
    /// spin, a release whose stream goes on after the watcher's look waits for that pause (an
    /// enqueue or the stream's progress does not end it: only a pause longer than the shortest
    /// does), not the default's 250 µs at most; a `flush` asks for a look at once. (Mutation
    /// testing: with the watcher reading the defaults instead, the owner went within
    /// microseconds.) Load only delays a drop, so the 200 ms without one cannot fail by it.
    fn the_watcher_paces_its_event_side_as_installed(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let slow = PollerSettings {
            spin: std::time::Duration::ZERO,
            interval: std::time::Duration::from_secs(10),
            max_interval: std::time::Duration::from_secs(10),
            ..PollerSettings::DEFAULT
        };
        Config::new().event_poller(slow).install().unwrap();
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let hold = cuda_workspace::testing::fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream");
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        // The watcher has looked (the flush's round) and parks for its pause.
        flush(PATIENCE).unwrap();
        hold.release();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(drops.dropped(), 0, "seen before the installed pause");
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1);
    }

    /// What the program installs is in force where the environment says nothing.
    fn an_installed_configuration_is_in_force() {
        let quiet = PollerSettings {
            spin: std::time::Duration::ZERO,
            ..PollerSettings::DEFAULT
        };
        Config::new()
            .event_poller(quiet)
            .reaper_pace(std::time::Duration::ZERO, std::time::Duration::from_micros(3))
            .install()
            .unwrap();
        let config = config().unwrap();
        assert_eq!(config.event_poller_settings(), quiet);
        assert_eq!(
            config.reaper_waits(),
            (std::time::Duration::ZERO, std::time::Duration::from_micros(3))
        );
        // And the crate runs with it: a release completes, the reaper parking after each batch.
        let stream = Stream::new(&fake_primary_context()).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        flush(PATIENCE).unwrap();
    }

    /// An override that is not understood is an error that names the variable, its value and
    /// what it may hold, from `install` and from `config` (never a silent default).
    fn an_override_not_understood_is_an_error(CUDA_HOST_LAUNCH_REAPER_LINGER_US = "2ms") {
        for result in [Config::new().install(), config().map(|_| ())] {
            match result {
                Err(Error::InvalidEnvironment { variable, value, expected }) => {
                    assert_eq!((variable, value.as_str()), (REAPER_LINGER_ENV, "2ms"));
                    assert!(expected.contains("microseconds"), "{expected}");
                }
                other => panic!("expected InvalidEnvironment, got {other:?}"),
            }
        }
    }

    /// The same for the event poller's override.
    fn an_unknown_poller_override_is_an_error(CUDA_HOST_LAUNCH_POLLER = "fast") {
        match config() {
            Err(Error::InvalidEnvironment { variable, value, .. }) => {
                assert_eq!((variable, value.as_str()), (POLLER_ENV, "fast"));
            }
            other => panic!("expected InvalidEnvironment, got {other:?}"),
        }
        let _ = REAPER_POLL_ENV;
    }
}
