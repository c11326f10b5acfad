//! Launches whose host function has not run yet, per context, so that their owners can be
//! reclaimed once the driver can no longer run them.

pub(crate) mod pending;
