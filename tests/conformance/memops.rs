//! Stream memory operations on mapped host memory: `cuStreamWaitValue32` and
//! `cuStreamWriteValue32/64`, also under capture.

use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use cuda_dl_sys::types::{CUgraph, CUgraphExec, CUgraphNodeType, CUresult, CUstreamCaptureMode};
use cuda_workspace::testing::bump;

use super::harness::{MAPPED, SETTLE, cases, code, data, leak};

/// `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND`, `_NOR`.
const GEQ: u32 = 0;
const EQ: u32 = 1;
const AND: u32 = 2;
const NOR: u32 = 3;

cases! {
    /// `cuStreamWaitValue32` holds its stream until the mapped word meets the condition (`GEQ`,
    /// `EQ`, `AND`, `NOR`), whatever the host writes before.
    fn wait_value_holds_a_stream_until_the_word_meets_its_condition(cx) {
        // (condition, value, a write that does not meet it, one that does)
        let cases = [
            (GEQ, 5, 4, 6),
            (EQ, 5, 6, 5),
            (AND, 0b100, 0b011, 0b110),
            (NOR, 0b0101, 0xffff_fffa, 0xffff_fff0),
        ];
        for (condition, value, miss, hit) in cases {
            let stream = cx.stream();
            let word = cx.word();
            if condition == NOR {
                word.host.store(u32::MAX, Ordering::Release);
            }
            let count = leak(AtomicUsize::new(0));
            // SAFETY: a live stream; a mapped, aligned word; `count` is leaked.
            unsafe {
                cx.driver.cuStreamWaitValue32(stream, word.device, value, condition).unwrap();
                cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)).unwrap();
            }
            word.host.store(miss, Ordering::Release);
            std::thread::sleep(SETTLE);
            assert_eq!(count.load(Ordering::SeqCst), 0, "condition {condition}: ran at {miss:#x}");
            // SAFETY: a live stream.
            assert_eq!(code(unsafe { cx.driver.cuStreamQuery(stream) }), Some(CUresult::CUDA_ERROR_NOT_READY));
            word.host.store(hit, Ordering::Release);
            // SAFETY: a live stream.
            unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 1, "condition {condition}");
        }
    }

    /// `cuStreamWriteValue32` and `cuStreamWriteValue64` write mapped host memory in stream order.
    fn value_writes_land_in_mapped_host_memory_in_stream_order(cx) {
        let stream = cx.stream();
        let word = cx.word();
        let mut host = ptr::null_mut();
        let mut device = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            cx.driver.cuMemHostAlloc(&mut host, 64, MAPPED).unwrap();
            cx.driver.cuMemHostGetDevicePointer(&mut device, host, 0).unwrap();
        }
        // SAFETY: 64 bytes, 8-aligned, never freed here.
        let wide = unsafe { AtomicU64::from_ptr(host.cast()) };
        wide.store(0, Ordering::Release);
        let hold = cx.hold(stream);
        // SAFETY: a live stream; mapped, aligned addresses.
        unsafe {
            cx.driver.cuStreamWriteValue32(stream, word.device, 1, 0).unwrap();
            cx.driver.cuStreamWriteValue32(stream, word.device, 2, 0).unwrap();
            cx.driver.cuStreamWriteValue64(stream, device, 0x1_0000_0002, 0).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!((word.host.load(Ordering::Acquire), wide.load(Ordering::Acquire)), (0, 0));
        hold.release();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!((word.host.load(Ordering::Acquire), wide.load(Ordering::Acquire)), (2, 0x1_0000_0002));
    }

    /// A value write on a capturing stream is captured as one node (a batch memory operation);
    /// every launch of the graph writes again.
    fn a_value_write_in_a_capture_is_a_node_that_every_replay_repeats(cx) {
        let stream = cx.stream();
        let word = cx.word();
        let mut graph: CUgraph = ptr::null_mut();
        let mut exec: CUgraphExec = ptr::null_mut();
        let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: live handles, valid out-pointers, a mapped word.
        unsafe {
            cx.driver.cuStreamBeginCapture(stream, relaxed).unwrap();
            cx.driver.cuStreamWriteValue32(stream, word.device, 9, 0).unwrap();
            cx.driver.cuStreamEndCapture(stream, &mut graph).unwrap();
            let mut nodes = [ptr::null_mut(); 4];
            let mut n = nodes.len();
            cx.driver.cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n).unwrap();
            assert_eq!(n, 1);
            let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            cx.driver.cuGraphNodeGetType(nodes[0], &mut kind).unwrap();
            assert_eq!(kind, CUgraphNodeType::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
            assert_eq!(word.host.load(Ordering::Acquire), 0, "written at capture");
            cx.driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0).unwrap();
            for _ in 0..2 {
                word.host.store(0, Ordering::Release);
                cx.driver.cuGraphLaunch(exec, stream).unwrap();
                cx.driver.cuStreamSynchronize(stream).unwrap();
                assert_eq!(word.host.load(Ordering::Acquire), 9);
            }
            cx.driver.cuGraphExecDestroy(exec).unwrap();
            cx.driver.cuGraphDestroy(graph).unwrap();
        }
    }
}
