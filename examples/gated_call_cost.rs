//! What the version gate and the checked call cost: ns per call of `cuDriverGetVersion` through the
//! table's checked method (`driver.cuDriverGetVersion(..)`: one atomic load, the call, the result
//! check) and through a cached raw pointer, on whichever driver loads (the fake one where no driver
//! is found). Issue 23 asks for the difference to stay within 2 ns.
//!
//! `cargo run --release --example gated_call_cost` (set `GATED_CALLS`, `GATED_REPS` to change the
//! loop's size). The two loops alternate; prints the median of each and the median of
//! the paired differences (other processes' load moves both loops of a pair alike).

use std::time::Instant;

use cuda_dl_sys::types::CUresult;
use cuda_dl_sys::{Driver, LoadOptions};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls = env_number("GATED_CALLS", 200_000);
    let reps = env_number("GATED_REPS", 201);
    let driver = match cuda_dl_sys::driver() {
        Ok(d) => d,
        Err(_) => {
            let path = cuda_workspace::testing::fake_driver_path();
            // SAFETY: the workspace's fake driver implements the driver's C ABI with cuda.h's
            // signatures; it is built with this workspace.
            unsafe { Driver::load(LoadOptions::with_library_path(path))? }
        }
    };
    let raw = driver.raw().cuDriverGetVersion()?;
    let (mut through_table, mut through_pointer, mut differences) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let mut v = 0;
        let t = Instant::now();
        for _ in 0..calls {
            // SAFETY: a valid out-pointer.
            unsafe { std::hint::black_box(driver).cuDriverGetVersion(&mut v) }?;
        }
        through_table.push(t.elapsed().as_nanos() as f64 / calls as f64);
        let t = Instant::now();
        for _ in 0..calls {
            // SAFETY: a valid out-pointer.
            let code = unsafe { std::hint::black_box(raw)(&mut v) };
            if code != CUresult::CUDA_SUCCESS {
                return Err(format!("cuDriverGetVersion returned {}", code.0).into());
            }
        }
        through_pointer.push(t.elapsed().as_nanos() as f64 / calls as f64);
        differences.push(
            through_table[through_table.len() - 1] - through_pointer[through_pointer.len() - 1],
        );
    }
    let (table, pointer) = (median(&mut through_table), median(&mut through_pointer));
    let difference = median(&mut differences);
    println!(
        "{} at {}: checked table call {table:.2} ns, raw pointer {pointer:.2} ns, difference {difference:+.2} ns \
         (medians of {reps} paired repetitions of {calls} calls each)",
        driver.path().display(),
        driver.version(),
    );
    Ok(())
}
