//! The launch record and what it needs below the cleanup queue: its layout and kinds of content,
//! the pool its small instances live in, and the tickets that name a run-once launch to the driver
//! (with the state word that says who owns the launch).

pub(crate) mod launch_state;
#[cfg(not(loom))]
pub(crate) mod layout;
#[cfg(not(loom))]
pub(crate) mod payload;
pub(crate) mod pool;
pub(crate) mod ticket_id;
pub(crate) mod ticket_table;
#[cfg(not(loom))]
pub(crate) mod tickets;
