//! How the crate's threads (the reaper, the watcher, the watcher) are named,
//! placed on CPUs and started: the settings alone, part of the crate's one
//! [`Config`](crate::Config); `crate_threads` starts the threads with them.

use std::sync::Arc;

/// Which of the crate's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrateThread {
    /// The cleanup queue's reaper, the crate's lane for user code: drops owners, runs
    /// `spawn_after` callbacks, reports caught panics.
    Reaper,
    /// The watcher: queries events and reads flag words, wakes futures, and hands everything
    /// else to the reaper (it runs no owner's `Drop` and no callback).
    Watcher,
}

impl CrateThread {
    /// Its name unless [`ThreadSettings::name`] says otherwise: `cuda-hl-reaper`, `cuda-hl-watch`
    /// (each within the 15 bytes that Linux shows).
    pub const fn default_name(self) -> &'static str {
        match self {
            CrateThread::Reaper => "cuda-hl-reaper",
            CrateThread::Watcher => "cuda-hl-watch",
        }
    }
}

/// Where a crate thread may run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Affinity {
    /// Every CPU the process may use (its cpuset), whatever the starting thread was pinned to (the
    /// default; on systems other than Linux, as `Inherit`).
    #[default]
    Process,
    /// What the thread that starts it has (the operating system's default).
    Inherit,
    /// These CPUs (indices as the operating system numbers them); CPUs the process may not use
    /// are left out, and if none is left the thread keeps what it inherited.
    Cpus(Vec<usize>),
}

/// Code run on a crate thread as it starts, before it does anything else.
pub type StartHook = Arc<dyn Fn(CrateThread) + Send + Sync>;

/// How the crate starts its threads: part of its [`Config`](crate::Config), the same for every
/// thread it starts, from the first to the last.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ThreadSettings {
    /// Where each thread may run.
    pub affinity: Affinity,
    /// Each thread's name ([`CrateThread::default_name`] when `None`). On Linux a thread's name
    /// is cut to 15 bytes where the operating system shows it. Called on the thread that starts
    /// one, with no lock of the crate held (it may call into the crate), and possibly more than
    /// once per thread started (two threads may race to start the same one).
    pub name: Option<Arc<dyn Fn(CrateThread) -> String + Send + Sync>>,
    /// Run on each thread as it starts (after its name and affinity are set).
    pub start: Option<StartHook>,
}

impl ThreadSettings {
    /// The defaults: [`Affinity::Process`], the default names, no start hook.
    pub fn new() -> ThreadSettings {
        ThreadSettings::default()
    }

    /// With this affinity.
    pub fn affinity(mut self, affinity: Affinity) -> ThreadSettings {
        self.affinity = affinity;
        self
    }

    /// With names from `name`.
    pub fn name(mut self, name: impl Fn(CrateThread) -> String + Send + Sync + 'static) -> Self {
        self.name = Some(Arc::new(name));
        self
    }

    /// With `start` run on each thread as it starts.
    pub fn on_start(mut self, start: impl Fn(CrateThread) + Send + Sync + 'static) -> Self {
        self.start = Some(Arc::new(start));
        self
    }
}

impl std::fmt::Debug for ThreadSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadSettings")
            .field("affinity", &self.affinity)
            .field("name", &self.name.as_ref().map(|_| "custom"))
            .field("start", &self.start.as_ref().map(|_| "set"))
            .finish()
    }
}
