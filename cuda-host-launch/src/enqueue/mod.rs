//! The launch protocol, in one place: how a record built by a public call reaches the driver (or
//! the watcher) and who owns it at each step. Every transport calls the same steps, in this order:
//!
//! ```text
//!  public call: builds an OwnedRecord (reaper::owned_record)
//!    │
//!    ├─ admit (admit.rs)        every check that needs nothing handed anywhere: not inside a host
//!    │                          function, not a forked child, driver loaded, exit handler armed,
//!    │                          the reaper (the lane) started. An error: the record goes back.
//!    ├─ transport's own looks    capture, context, an event from the pool...   (error: back)
//!    ├─ submit (submit.rs)      a ticket held (LAUNCHING), the transport's launch call with the
//!    │                          ticket's id, then:
//!    │     refused ─────────────  the record is the caller's again: a Refusal carries it back
//!    │     accepted ────────────  handed over (PENDING); if its host function already ran, queued
//!    │                          for release at once
//!    └─ finish (admit.rs)       manual cleanup mode: the launching thread drains the queue
//!
//!  then, on another thread, exactly one of (pending.rs, on the ticket table's protocol):
//!    run      the trampoline (driver's thread) or the watcher claims it, runs it, queues it
//!    reclaim  its context is gone: a reclaim claims it and queues it unrun
//!  and the reaper releases it (owners dropped, ticket given back).
//! ```
//!
//! A [`Refusal`](refusal::Refusal) says whether the record went back to the caller or the crate
//! keeps it (a capture may hold what was enqueued; a graph's user object owns it): public calls
//! turn it into a [`LaunchError`](crate::LaunchError). `LowLatency` futures enqueue no record (a
//! flag write): they are admitted and finished here, with their own middle step.
//!
//! The ticket table's half of the protocol (take, run, walk, reclaim, give back) is
//! `record/ticket_table.rs`, model-checked by `loom_models::tickets`; the ownership word of one
//! launch is `record/launch_state.rs`.

pub(crate) mod admit;
pub(crate) mod pending;
pub(crate) mod refusal;
pub(crate) mod submit;
