//! Thin RAII types over the driver: just what tests and examples need to get a device, its primary
//! context, streams and events. Each is `Send + Sync` (driver handles may be used from any thread),
//! and each defers its destruction off the driver's thread if it is dropped inside a host function;
//! inside a host function their calls that reach the driver return
//! [`Error::InsideHostFunction`](crate::Error::InsideHostFunction) instead.

mod context;
mod device;
mod event;
mod stream;

pub use context::PrimaryContext;
pub use device::Device;
pub use event::Event;
pub use stream::Stream;
