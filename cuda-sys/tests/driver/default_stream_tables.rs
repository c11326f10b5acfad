//! Both default-stream tables in one process (issue 23, item 3): the legacy and the per-thread table
//! sit side by side over one library, each resolved lazily with its own `cuGetProcAddress` flag (or
//! its own export before 11.3); the environment's mode stays the one `driver()` returns.

use std::ptr;

use cuda_dl_sys::types::CUstream;
use cuda_dl_sys::{DefaultStream, Driver, Function};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{current_primary_context, fake, fake_driver_path, load_fake_driver};

/// Calls `cuStreamSynchronize` on `stream` through `table` and returns how many calls of the
/// legacy and of the per-thread export the fake saw during it.
fn synchronize_through(table: &Driver, stream: CUstream) -> (u64, u64) {
    // The base name counts every variant; the `_ptsz` export only itself.
    let counts = || {
        let per_thread = fake().call_count("cuStreamSynchronize_ptsz");
        (
            fake().call_count("cuStreamSynchronize") - per_thread,
            per_thread,
        )
    };
    let before = counts();
    // SAFETY: `stream` is live (or the null stream of a thread with a current context).
    unsafe { table.cuStreamSynchronize(stream).unwrap() };
    let after = counts();
    (after.0 - before.0, after.1 - before.1)
}

/// Both tables resolve `cuStreamSynchronize` with their own flag and call their own variant.
fn both_tables_call_their_own_variant(expect_flags: bool) {
    let driver = load_fake_driver();
    assert_eq!(driver.default_stream(), DefaultStream::Legacy);
    let _context = current_primary_context(driver);
    let legacy = driver.legacy();
    let per_thread = driver.per_thread();
    assert!(ptr::eq(legacy, driver));
    assert_eq!(per_thread.default_stream(), DefaultStream::PerThread);
    assert!(ptr::eq(per_thread.legacy(), driver));
    assert!(ptr::eq(per_thread.per_thread(), per_thread));
    assert!(
        ptr::eq(cuda_dl_sys::driver().unwrap(), driver),
        "the default moved"
    );

    assert_eq!(synchronize_through(per_thread, ptr::null_mut()), (0, 1));
    if expect_flags {
        assert_eq!(fake().last_proc_address_flags(), 2);
    }
    assert_eq!(synchronize_through(legacy, ptr::null_mut()), (1, 0));
    if expect_flags {
        assert_eq!(fake().last_proc_address_flags(), 1);
    }
    // Cached in each: no more lookups, each call still reaches its own variant.
    let lookups = fake().proc_address_calls(1) + fake().proc_address_calls(2);
    assert_eq!(synchronize_through(per_thread, ptr::null_mut()), (0, 1));
    assert_eq!(synchronize_through(legacy, ptr::null_mut()), (1, 0));
    assert_eq!(
        fake().proc_address_calls(1) + fake().proc_address_calls(2),
        lookups
    );

    let legacy_address = legacy.resolve(Function::cuStreamSynchronize).unwrap();
    let per_thread_address = per_thread.resolve(Function::cuStreamSynchronize).unwrap();
    assert_ne!(legacy_address, per_thread_address);
    // A function without a per-thread variant is the same function in both.
    assert_eq!(
        legacy.resolve(Function::cuCtxGetCurrent).unwrap(),
        per_thread.resolve(Function::cuCtxGetCurrent).unwrap()
    );
}

/// The per-thread table's answer is the same through every lookup path: an ABI variant without a
/// per-thread twin, of a function that has per-thread variants, is `NoPerThreadVariant` (never its
/// legacy export, whose default-stream semantics are not the table's). Checked for every entry the
/// fake has (the legacy table resolves it). Returns how many had no twin.
fn per_thread_table_walk() -> usize {
    let legacy = load_fake_driver().legacy();
    let per_thread = legacy.per_thread();
    let mut no_twin = 0;
    for &f in Function::ALL {
        if legacy.resolve(f).is_err() {
            continue; // not in the fake, or above its version
        }
        let expect_no_twin = cuda_workspace::testing::lacks_per_thread_variant(f);
        match per_thread.resolve(f) {
            Ok(_) => assert!(!expect_no_twin, "{}: resolved in per-thread mode", f.name()),
            Err(cuda_dl_sys::Error::SymbolMissing {
                reason: cuda_dl_sys::MissingReason::NoPerThreadVariant,
                ..
            }) if expect_no_twin => no_twin += 1,
            Err(e) if expect_no_twin => panic!("{}: {e}", f.name()),
            // A per-thread variant the fake lacks, or above its version.
            Err(_) => {}
        }
    }
    no_twin
}

isolated_test! {
    /// 13.0, 11.8 and 10.2 (cuGetProcAddress_v2, cuGetProcAddress, the exports) agree on which
    /// per-thread entries do not exist.
    fn the_per_thread_table_lacks_the_same_variants_through_every_lookup_path_13_0(
        FAKE_CUDA_VERSION = "13000"
    ) {
        assert!(per_thread_table_walk() > 0);
    }

    fn the_per_thread_table_lacks_the_same_variants_through_every_lookup_path_11_8(
        FAKE_CUDA_VERSION = "11080"
    ) {
        assert!(per_thread_table_walk() > 0);
    }

    fn the_per_thread_table_lacks_the_same_variants_through_every_lookup_path_10_2(
        FAKE_CUDA_VERSION = "10020"
    ) {
        assert!(per_thread_table_walk() > 0);
    }
}

isolated_test! {
    /// 13.0 (`cuGetProcAddress_v2`): flag 2 for the per-thread table, 1 for the legacy one.
    fn both_default_stream_tables_work_side_by_side_on_13_0(FAKE_CUDA_VERSION = "13000") {
        both_tables_call_their_own_variant(true);
    }

    /// 11.8 (`cuGetProcAddress`): the same, through the older lookup.
    fn both_default_stream_tables_work_side_by_side_on_11_8(FAKE_CUDA_VERSION = "11080") {
        both_tables_call_their_own_variant(true);
    }

    /// 10.2 (exports): the per-thread table looks up the `_ptsz` export, the legacy one the plain.
    fn both_default_stream_tables_work_side_by_side_on_10_2(FAKE_CUDA_VERSION = "10020") {
        both_tables_call_their_own_variant(false);
    }

    /// `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM=1` still makes the per-thread table the process's
    /// default, and the legacy one is still there beside it.
    fn the_environment_still_chooses_the_default_table(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM = "1"
    ) {
        let driver = cuda_dl_sys::driver().unwrap();
        assert_eq!(driver.default_stream(), DefaultStream::PerThread);
        assert!(ptr::eq(Driver::get().unwrap(), driver));
        assert_eq!(driver.legacy().default_stream(), DefaultStream::Legacy);
        let _context = current_primary_context(driver);
        assert_eq!(synchronize_through(driver, ptr::null_mut()), (0, 1));
        assert_eq!(synchronize_through(driver.legacy(), ptr::null_mut()), (1, 0));
    }
}
