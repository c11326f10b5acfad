//! `cuda-dl-sys` against the fake driver (`tests/fake-cuda`), one module per area of the API: each
//! test runs in a process of its own (`isolated_test!`), as the driver is loaded once per process
//! and most tests configure the fake before it loads. One test binary for all of them (each binary
//! costs link time in every `cargo test`).

mod abi_variants;
mod adopt;
mod default_stream_tables;
mod errors;
mod loading;
mod resolution;
mod resolution_paths;
mod version_gate;
