//! The low-latency transport's flag pages (4 KiB of host memory, page-aligned, registered with
//! the driver) live as long as their context: a page is kept for the context's next completions,
//! and freed once the context is gone. Counted by a global allocator that notes the live
//! allocations of a page's layout (nothing else in these cases makes one: no launch, so no record
//! pool segment). Each case in a process of its own, on the fake driver.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use cuda_host_launch::{CompletionMode, Device, PrimaryContext, Stream, flush};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{PATIENCE, fake_driver_path};
use std::sync::Arc;

/// Live allocations of 4096 bytes aligned to 4096.
static PAGES: AtomicIsize = AtomicIsize::new(0);

struct CountingPages;

fn is_page(layout: Layout) -> bool {
    layout.size() == 4096 && layout.align() == 4096
}

// SAFETY: every call is passed on to the system allocator as it came; only a count is kept beside.
unsafe impl GlobalAlloc for CountingPages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if is_page(layout) && !p.is_null() {
            PAGES.fetch_add(1, Ordering::SeqCst);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if is_page(layout) && !p.is_null() {
            PAGES.fetch_add(1, Ordering::SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if is_page(layout) {
            PAGES.fetch_sub(1, Ordering::SeqCst);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingPages = CountingPages;

/// Polls `future` until it resolves (bounded by `PATIENCE`).
fn resolve<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "the completion never resolved");
        std::thread::sleep(Duration::from_micros(100));
    }
}

isolated_test! {
    /// One page serves a context's completions, one after another; the context's reset frees
    /// it. (Mutation testing: with the page's `Drop` emptied, its memory leaked at every lost
    /// context, and every test passed.)
    fn a_contexts_flag_page_is_kept_for_its_completions_and_freed_when_it_is_gone(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let before = PAGES.load(Ordering::SeqCst);
        for _ in 0..3 {
            resolve(CompletionMode::LowLatency.completion(&stream).unwrap()).unwrap();
        }
        assert_eq!(PAGES.load(Ordering::SeqCst), before + 1, "pages for three completions");
        drop(stream);
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        unsafe { context.reset() }.unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(PAGES.load(Ordering::SeqCst), before, "the reset context's page is not freed");
    }

    /// Another binding resets device 0's primary context; the next completion there (no flush
    /// between) finds the pages of the context that is gone at the handle, frees them and makes
    /// a page of its own; device 1's page is untouched and still serves. (Mutation testing: with
    /// any of the tests that pick the gone pages changed, the old page was kept, or device 1's
    /// was dropped, and every test passed.)
    fn a_completion_in_a_context_made_again_frees_the_gone_contexts_pages(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        let (zero, one, before) = pages_on_two_devices();
        let stream = foreign_reset(&zero);
        // No flush: a flush would free the gone context's page first.
        complete(&stream);
        assert_eq!(PAGES.load(Ordering::SeqCst), before + 2, "device 0's new page, device 1's");
        complete(&Stream::new(&one).unwrap());
        assert_eq!(PAGES.load(Ordering::SeqCst), before + 2, "device 1's page replaced");
    }

    /// After another binding's reset of device 0's primary context, a `flush` frees the gone
    /// context's page; device 1's page is kept and still serves. (Mutation testing: with the
    /// low-latency handles not listed for the flush's look, or the pages of the live contexts
    /// dropped instead of the gone one's, and every test passed.)
    fn a_flush_frees_the_page_of_a_context_another_binding_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        let (zero, one, before) = pages_on_two_devices();
        let _stream = foreign_reset(&zero);
        flush(PATIENCE).unwrap();
        assert_eq!(PAGES.load(Ordering::SeqCst), before + 1, "device 0's page kept");
        complete(&Stream::new(&one).unwrap());
        assert_eq!(PAGES.load(Ordering::SeqCst), before + 1, "device 1's page replaced");
    }
}

/// One low-latency completion on `stream`, resolved.
fn complete(stream: &Stream) {
    resolve(CompletionMode::LowLatency.completion(stream).unwrap()).unwrap();
}

/// Devices 0 and 1 retained, a completion on each: their contexts, and the count of pages before.
fn pages_on_two_devices() -> (Arc<PrimaryContext>, Arc<PrimaryContext>, isize) {
    let zero = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
    let one = PrimaryContext::retain(Device::get(1).unwrap()).unwrap();
    let before = PAGES.load(Ordering::SeqCst);
    complete(&Stream::new(&zero).unwrap());
    complete(&Stream::new(&one).unwrap());
    assert_eq!(
        PAGES.load(Ordering::SeqCst),
        before + 2,
        "a page per context"
    );
    (zero, one, before)
}

/// Resets `context` as another binding would (`cuDevicePrimaryCtxReset`, nothing of the crate's
/// in flight), then retains it again as that binding's next call does (on the H200 the context
/// stays destroyed until a retain makes it again: `tools/probes/reset_and_register.c`), and
/// returns a stream of the context made again. The second retain is kept to the process's end.
fn foreign_reset(context: &Arc<PrimaryContext>) -> Stream {
    let driver = cuda_dl_sys::driver().unwrap();
    let device = context.device().raw();
    let mut again = std::ptr::null_mut();
    // SAFETY: every stream of the context is dropped; nothing made in it is used after; a valid
    // out-pointer.
    unsafe {
        driver.cuDevicePrimaryCtxReset_v2(device).unwrap();
        driver.cuDevicePrimaryCtxRetain(&mut again, device).unwrap();
    }
    assert_eq!(again, context.raw(), "the handle stays");
    Stream::new(context).unwrap()
}
