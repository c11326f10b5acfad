//! Build script of the workspace's root package.
//!
//! A normal build does nothing here: the bindings in `cuda-sys/src/generated/` are committed. With the
//! `regenerate` feature it runs bindgen over `wrapper.h` and derives the driver-function table from
//! `cudaTypedefs.h` (see `tools/codegen/`), writing the results to `OUT_DIR` and, when
//! `CUDA_DL_SYS_WRITE_GENERATED=1`, over the committed files. `scripts/regenerate-bindings` is the one
//! command that does all of it.

#[cfg(feature = "regenerate")]
#[path = "tools/codegen/mod.rs"]
mod codegen;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-changed=tools/codegen");
    #[cfg(feature = "regenerate")]
    codegen::run();
}
