//! Panics in host closures and in owners' `Drop` never reach the driver: they are caught, reported
//! through the panic handler (by the releasing thread, never the driver's), and everything goes on:
//! later host functions on the stream run, the reaper keeps dropping owners, a graph keeps
//! replaying. The handler is process-wide, so each test has a process of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_host_launch::{
    Graph, PanicOrigin, Stream, add_host_node, host_launch, reset_panic_handler, set_panic_handler,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, PATIENCE, ThreadInfo, fake_primary_context};

/// Marks the panics these tests cause, so the panic hook can keep them off stderr.
const EXPECTED: &str = "[expected panic]";

/// What the handler received: origin, message, and the reporting thread.
type Reports = Arc<Mutex<Vec<(PanicOrigin, String, ThreadInfo)>>>;

/// Installs a handler that collects reports, and a panic hook that keeps this test's own panics
/// quiet (others still print).
fn collect_reports() -> Reports {
    let reports: Reports = Arc::default();
    let sink = Arc::clone(&reports);
    set_panic_handler(move |report| {
        sink.lock().unwrap().push((
            report.origin,
            report.message.to_string(),
            ThreadInfo::current(),
        ));
    });
    cuda_workspace::testing::quiet_expected_panics(|m| m.contains(EXPECTED));
    reports
}

/// Waits (flushing) until `n` reports have arrived, then returns them.
#[track_caller]
fn wait_reports(reports: &Reports, n: usize) -> Vec<(PanicOrigin, String, ThreadInfo)> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        cuda_host_launch::flush(PATIENCE).unwrap();
        let got = reports.lock().unwrap().clone();
        if got.len() >= n {
            assert_eq!(got.len(), n, "{got:?}");
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} reports",
            got.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Owners whose `Drop` panics.
struct PanickingDrop;

impl Drop for PanickingDrop {
    fn drop(&mut self) {
        panic!("{EXPECTED} from an owner's Drop");
    }
}

isolated_test! {
    /// A closure that panics is reported once (origin `HostFunction`, its message) by the reaper;
    /// its owners are still dropped, and the host functions after it on the stream run.
    fn a_panicking_closure_is_reported_and_later_host_functions_on_the_stream_still_run() {
        let reports = collect_reports();
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let ran = Arc::new(AtomicUsize::new(0));
        let owner = drops.owner();
        host_launch(&stream, move || {
            let _keep = &owner;
            panic!("{EXPECTED} boom from a host function");
        })
        .unwrap();
        for _ in 0..3 {
            let (ran, owner) = (Arc::clone(&ran), drops.owner());
            host_launch(&stream, move || {
                let _keep = &owner;
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        drops.wait_dropped(4);
        let reports = wait_reports(&reports, 1);
        reset_panic_handler();
        let (origin, message, thread) = &reports[0];
        assert_eq!(*origin, PanicOrigin::HostFunction);
        assert_eq!(message, &format!("{EXPECTED} boom from a host function"));
        assert!(thread.is_reaper(), "reported on {thread:?}");
    }

    /// An owner whose `Drop` panics is reported (origin `OwnerDrop`, by the reaper); the other
    /// owners of that launch are still dropped, and the reaper goes on dropping later owners, also
    /// after a panic handler that itself panics.
    fn a_panicking_owner_drop_is_reported_and_the_reaper_keeps_dropping_later_owners() {
        let reports = collect_reports();
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let owners = (drops.owner(), PanickingDrop, drops.owner());
        host_launch(&stream, move || {
            let _keep = &owners;
        })
        .unwrap();
        let later = Drops::new();
        let owner = later.owner();
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        stream.synchronize().unwrap();
        let records = drops.wait_dropped(2);
        assert!(records.iter().all(|r| r.thread.is_reaper()), "{records:?}");
        later.wait_dropped(1);
        let got = wait_reports(&reports, 1);
        let (origin, message, thread) = &got[0];
        assert_eq!(*origin, PanicOrigin::OwnerDrop);
        assert_eq!(message, &format!("{EXPECTED} from an owner's Drop"));
        assert!(thread.is_reaper(), "reported on {thread:?}");

        set_panic_handler(|_| panic!("{EXPECTED} from the panic handler"));
        let panicking = PanickingDrop;
        host_launch(&stream, move || {
            let _keep = &panicking;
        })
        .unwrap();
        let last = Drops::new();
        for _ in 0..3 {
            let owner = last.owner();
            host_launch(&stream, move || {
                let _keep = &owner;
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        let records = last.wait_dropped(3);
        assert!(records.iter().all(|r| r.thread.is_reaper()), "{records:?}");
        reset_panic_handler();
    }

    /// A repeatable closure (a graph host node) that panics is reported on every run; the graph
    /// keeps working: the node after it runs every time.
    fn a_panicking_graph_host_node_is_reported_on_every_run_and_the_graph_keeps_working() {
        let reports = collect_reports();
        let context = fake_primary_context();
        let stream = Stream::new_non_blocking(&context).unwrap();
        let graph = Graph::new().unwrap();
        let after = Arc::new(AtomicUsize::new(0));
        let boom = add_host_node(&graph, &[], || panic!("{EXPECTED} boom from a graph node"));
        let boom = boom.unwrap();
        let counter = Arc::clone(&after);
        add_host_node(&graph, &[boom], move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let exec = graph.instantiate().unwrap();
        for _ in 0..3 {
            exec.launch(&stream).unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(after.load(Ordering::SeqCst), 3);
        let got = wait_reports(&reports, 3);
        for (origin, message, thread) in &got {
            assert_eq!(*origin, PanicOrigin::HostFunction);
            assert_eq!(message, &format!("{EXPECTED} boom from a graph node"));
            assert!(thread.is_reaper(), "reported on {thread:?}");
        }
        // Still working after the reports.
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(after.load(Ordering::SeqCst), 4);
        wait_reports(&reports, 4);
        reset_panic_handler();
    }
}
