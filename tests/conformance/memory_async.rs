//! Stream-ordered memory: `Async` copies and sets, the stream-ordered allocator, when each call
//! returns (the Driver API's "API synchronization behavior"), the per-thread exports, sticky
//! errors and captures.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUdeviceptr, CUgraph, CUgraphNodeType, CUresult, CUstreamCaptureMode};

use super::harness::{SETTLE, cases, code, leak};
use super::memory::{bytes, device_memory, pinned, read};

/// Runs `release` on another thread once `go` is set, or after `SETTLE` × 20 at the latest (for a
/// call that may wait for the stream the release unblocks); joined by the caller.
fn release_when(
    go: &'static AtomicBool,
    release: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + SETTLE * 20;
        while !go.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        release();
    })
}

/// Runs `release` on another thread after `SETTLE`, having set `released` first.
fn release_later(
    released: &'static AtomicBool,
    release: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(SETTLE);
        released.store(true, Ordering::SeqCst);
        release();
    })
}

cases! {
    /// `Async` copies and sets on a held stream run when the stream gets there, in order: a copy
    /// from page-locked memory reads it then (a write made after the call is copied), and nothing
    /// reaches the page-locked destination before.
    fn async_copies_and_sets_run_when_the_stream_gets_there(cx) {
        let stream = cx.stream();
        let (source, target) = (pinned(cx, 16), pinned(cx, 16));
        let (a, b) = (device_memory(cx, 16), device_memory(cx, 16));
        // SAFETY: 16 bytes, written before any copy runs.
        unsafe { ptr::copy_nonoverlapping((1..=16).collect::<Vec<u8>>().as_ptr(), source, 16) };
        let hold = cx.hold(stream);
        // SAFETY: a live stream; every buffer holds 16 bytes and outlives the work.
        unsafe {
            cx.driver.cuMemcpyHtoDAsync(a, source.cast(), 16, stream).unwrap();
            cx.driver.cuMemsetD8Async(a + 4, 0xee, 4, stream).unwrap();
            cx.driver.cuMemsetD16Async(a + 8, 0x1234, 2, stream).unwrap();
            cx.driver.cuMemsetD32Async(a + 12, 0xdead_beef, 1, stream).unwrap();
            cx.driver.cuMemcpyDtoDAsync(b, a, 16, stream).unwrap();
            cx.driver.cuMemcpyDtoHAsync(target.cast(), b, 16, stream).unwrap();
            // Page-locked memory is read when the stream gets there.
            source.write(100);
        }
        std::thread::sleep(SETTLE);
        assert_eq!(bytes(target, 16), vec![0; 16], "written before the stream got there");
        hold.release();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        let expected = [100, 2, 3, 4, 0xee, 0xee, 0xee, 0xee, 0x34, 0x12, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde];
        assert_eq!(bytes(target, 16), expected);
    }

    /// An `Async` copy from pageable host memory takes the source at the call (the driver stages
    /// it): the caller may overwrite it as soon as the call returns, even with the stream held.
    fn an_async_copy_from_pageable_memory_reads_it_at_the_call(cx) {
        let stream = cx.stream();
        let device = device_memory(cx, 16);
        let hold = cx.hold(stream);
        let copied = leak(AtomicBool::new(false));
        // (If the driver waits for the stream first, the hold is released after a while.)
        let releaser = release_when(copied, hold.releaser());
        let mut source = vec![7u8; 16];
        // SAFETY: a live stream; 16 bytes at `source`, only needed until the call returns.
        unsafe { cx.driver.cuMemcpyHtoDAsync(device, source.as_ptr().cast(), 16, stream) }.unwrap();
        source.fill(9);
        drop(source);
        copied.store(true, Ordering::SeqCst);
        releaser.join().unwrap();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!(read(cx, device, 16), vec![7; 16]);
    }

    /// An `Async` copy into pageable host memory returns only once the copy is done: with the
    /// stream held, not before the hold is released.
    fn an_async_copy_into_pageable_memory_returns_once_done(cx) {
        let stream = cx.stream();
        let device = device_memory(cx, 16);
        // SAFETY: a live stream; 16 bytes.
        unsafe {
            cx.driver.cuMemsetD8Async(device, 0x33, 16, stream).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        let hold = cx.hold(stream);
        let released = leak(AtomicBool::new(false));
        let releaser = release_later(released, hold.releaser());
        let mut output = vec![0u8; 16];
        // SAFETY: a live stream; 16 writable bytes.
        unsafe { cx.driver.cuMemcpyDtoHAsync(output.as_mut_ptr().cast(), device, 16, stream) }.unwrap();
        assert!(released.load(Ordering::SeqCst), "returned before the stream got to the copy");
        assert_eq!(output, vec![0x33; 16]);
        releaser.join().unwrap();
    }

    /// A synchronous copy runs on the legacy default stream, after its earlier work: with that
    /// stream held, `cuMemcpyDtoH` returns once the hold is released, with what the earlier set
    /// wrote.
    fn a_synchronous_copy_waits_for_the_default_streams_work(cx) {
        let device = device_memory(cx, 16);
        let hold = cx.hold(ptr::null_mut());
        // SAFETY: the legacy default stream of the current context; 16 bytes.
        unsafe { cx.driver.cuMemsetD8Async(device, 0x44, 16, ptr::null_mut()) }.unwrap();
        let released = leak(AtomicBool::new(false));
        let releaser = release_later(released, hold.releaser());
        let output = read(cx, device, 16);
        assert!(released.load(Ordering::SeqCst), "returned before the default stream's work");
        assert_eq!(output, vec![0x44; 16]);
        releaser.join().unwrap();
    }

    /// Memory from `cuMemAllocAsync` is usable in stream order at once, and its `cuMemFreeAsync`
    /// comes after the work enqueued before it.
    fn stream_ordered_memory_is_used_and_freed_in_stream_order(cx) {
        let stream = cx.stream();
        let target = pinned(cx, 64);
        let hold = cx.hold(stream);
        let mut device: CUdeviceptr = 0;
        // SAFETY: a live stream; 64 bytes, freed once, after its last use.
        unsafe {
            cx.driver.cuMemAllocAsync(&mut device, 64, stream).unwrap();
            assert_ne!(device, 0);
            cx.driver.cuMemsetD8Async(device, 0x21, 64, stream).unwrap();
            cx.driver.cuMemcpyDtoHAsync(target.cast(), device, 64, stream).unwrap();
            cx.driver.cuMemFreeAsync(device, stream).unwrap();
        }
        hold.release();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!(bytes(target, 64), vec![0x21; 64]);
    }

    /// Memory freed while queued work still uses it lasts until that work has run: the copy
    /// reads what was there. (The real driver's free may wait for the device; the fake's
    /// returns at once and releases the memory later.)
    fn memory_freed_while_queued_work_uses_it_lasts_until_that_work_ran(cx) {
        let stream = cx.stream();
        let (source, target) = (device_memory(cx, 64), device_memory(cx, 64));
        // SAFETY: 64 bytes.
        unsafe { cx.driver.cuMemsetD8(source, 0x3c, 64) }.unwrap();
        // SAFETY: no arguments.
        unsafe { cx.driver.cuCtxSynchronize() }.unwrap();
        let hold = cx.hold(stream);
        // SAFETY: a live stream; 64 bytes each.
        unsafe { cx.driver.cuMemcpyDtoDAsync(target, source, 64, stream) }.unwrap();
        let released = leak(AtomicBool::new(false));
        let releaser = release_later(released, hold.releaser());
        // SAFETY: allocated above, freed once.
        unsafe { cx.driver.cuMemFree(source) }.unwrap();
        releaser.join().unwrap();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!(read(cx, target, 64), vec![0x3c; 64]);
    }

    /// The per-thread exports (`_ptds`, `_ptsz`) use the calling thread's default stream for the
    /// handle 0: work there waits for a hold of `CU_STREAM_PER_THREAD`.
    fn per_thread_exports_use_the_threads_default_stream(cx) {
        let per_thread = cx.driver.per_thread();
        let device = device_memory(cx, 16);
        let other = device_memory(cx, 16);
        let target = pinned(cx, 16);
        let hold = cx.hold(cuda_dl_sys::CU_STREAM_PER_THREAD);
        // SAFETY: the calling thread's default stream; 16 bytes each.
        unsafe {
            per_thread.cuMemsetD8Async(device, 0x66, 16, ptr::null_mut()).unwrap();
            per_thread.cuMemcpyDtoHAsync(target.cast(), device, 16, ptr::null_mut()).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(bytes(target, 16), vec![0; 16], "ran before the per-thread stream got there");
        hold.release();
        let input = [5u8; 16];
        // SAFETY: as above.
        unsafe {
            per_thread.cuStreamSynchronize(ptr::null_mut()).unwrap();
            assert_eq!(bytes(target, 16), vec![0x66; 16]);
            per_thread.cuMemcpyHtoD(other, input.as_ptr().cast(), 16).unwrap();
            per_thread.cuMemsetD32(other + 4, 0x0909_0909, 1).unwrap();
            per_thread.cuMemcpyDtoD(device, other, 16).unwrap();
            let mut output = [0u8; 16];
            per_thread.cuMemcpyDtoH(output.as_mut_ptr().cast(), device, 16).unwrap();
            assert_eq!(output, [5, 5, 5, 5, 9, 9, 9, 9, 5, 5, 5, 5, 5, 5, 5, 5]);
        }
    }

    /// After a sticky error has surfaced, copies report it (`CUDA_ERROR_LAUNCH_FAILED`),
    /// synchronous or not.
    fn after_a_sticky_error_copies_report_it(cx) {
        let stream = cx.stream();
        let device = device_memory(cx, 16);
        let mut output = [0u8; 16];
        cx.sticky_error(stream);
        let failed = Some(CUresult::CUDA_ERROR_LAUNCH_FAILED);
        // SAFETY: a live stream and 16-byte buffers.
        unsafe {
            assert_eq!(code(cx.driver.cuMemcpyDtoH(output.as_mut_ptr().cast(), device, 16)), failed);
            assert_eq!(code(cx.driver.cuMemcpyHtoDAsync(device, output.as_ptr().cast(), 16, stream)), failed);
        }
    }

    /// In a capture, `Async` sets and copies between device and page-locked memory become
    /// memset and memcpy nodes of the graph: nothing happens at the call, and every launch of the
    /// executable graph sets and copies again, reading the source at the launch.
    fn async_copies_and_sets_in_a_capture_become_nodes_that_each_launch_replays(cx) {
        let stream = cx.stream();
        let (source, target) = (pinned(cx, 8), pinned(cx, 16));
        let device = device_memory(cx, 16);
        let mut graph: CUgraph = ptr::null_mut();
        let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: 8 bytes of page-locked memory, no stream writes it yet.
        unsafe { ptr::copy_nonoverlapping([1u8, 2, 3, 4, 5, 6, 7, 8].as_ptr(), source, 8) };
        // SAFETY: a live stream; every buffer holds the bytes each call names and outlives the
        // launches.
        unsafe {
            cx.driver.cuStreamBeginCapture(stream, relaxed).unwrap();
            cx.driver.cuMemsetD32Async(device, 0x0707_0707, 4, stream).unwrap();
            cx.driver.cuMemcpyHtoDAsync(device + 8, source.cast(), 8, stream).unwrap();
            cx.driver.cuMemcpyDtoHAsync(target.cast(), device, 16, stream).unwrap();
            cx.driver.cuStreamEndCapture(stream, &mut graph).unwrap();
        }
        assert_eq!(bytes(target, 16), vec![0; 16], "a captured copy ran at the call");
        let mut count = 0;
        // SAFETY: a live graph; a valid out-pointer.
        unsafe { cx.driver.cuGraphGetNodes(graph, ptr::null_mut(), &mut count) }.unwrap();
        let mut nodes = vec![ptr::null_mut(); count];
        // SAFETY: room for `count` nodes.
        unsafe { cx.driver.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.unwrap();
        let types: Vec<CUgraphNodeType> = nodes
            .iter()
            .map(|node| {
                let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                // SAFETY: a node of the graph; a valid out-pointer.
                unsafe { cx.driver.cuGraphNodeGetType(*node, &mut t) }.unwrap();
                t
            })
            .collect();
        let (memset, memcpy) = (
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY,
        );
        assert_eq!(types.iter().filter(|t| **t == memset).count(), 1, "{types:?}");
        assert_eq!(types.iter().filter(|t| **t == memcpy).count(), 2, "{types:?}");
        let mut exec = ptr::null_mut();
        // SAFETY: a live graph and stream; valid out-pointers; the buffers outlive the launches.
        unsafe {
            cx.driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0).unwrap();
            cx.driver.cuGraphLaunch(exec, stream).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(bytes(target, 16), [7, 7, 7, 7, 7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8]);
        // SAFETY: no launch is in flight (synchronized); 8 and 16 bytes.
        unsafe {
            ptr::copy_nonoverlapping([9u8; 8].as_ptr(), source, 8);
            ptr::write_bytes(target, 0, 16);
        }
        // SAFETY: live handles.
        unsafe {
            cx.driver.cuGraphLaunch(exec, stream).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
            cx.driver.cuGraphExecDestroy(exec).unwrap();
            cx.driver.cuGraphDestroy(graph).unwrap();
        }
        assert_eq!(bytes(target, 16), [7, 7, 7, 7, 7, 7, 7, 7, 9, 9, 9, 9, 9, 9, 9, 9]);
    }
}
