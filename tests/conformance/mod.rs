//! The conformance suite's cases, by area, and the harness that runs them on either driver.

pub mod harness;

mod capture;
mod contexts;
mod entry_points;
mod errors;
mod events;
mod graphs;
mod memops;
mod memory;
mod memory_async;
mod streams;
