//! The workspace's root package: the cross-crate integration tests (`tests/`), the examples and
//! the benchmarks live beside it. Its library is their support code, not published:
//!
//! - [`gpu`]: the embedded PTX kernels and host-mapped memory for tests and benchmarks that run on a
//!   real GPU;
//! - [`testing`]: the fake CUDA driver (`tests/fake-cuda`), its control functions, and tests that
//!   run in a process of their own ([`isolated_test!`]).

#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

pub mod gpu;
pub mod testing;

/// The README's Rust snippets, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeSnippets;
