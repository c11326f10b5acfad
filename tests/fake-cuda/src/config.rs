//! The fake's configuration: read once from the environment, adjustable through the control
//! functions.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::state::relock;

/// The version `cuDriverGetVersion` reports unless `FAKE_CUDA_VERSION` says otherwise.
pub(crate) const DEFAULT_VERSION: i32 = 13000;

pub(crate) struct Config {
    version: AtomicI32,
    stub: AtomicBool,
    devices: AtomicI32,
    missing: Mutex<BTreeSet<String>>,
}

static CONFIG: LazyLock<Config> = LazyLock::new(Config::from_env);

pub(crate) fn config() -> &'static Config {
    &CONFIG
}

impl Config {
    fn from_env() -> Config {
        let version = env_number("FAKE_CUDA_VERSION").unwrap_or(DEFAULT_VERSION);
        let devices = env_number("FAKE_CUDA_DEVICES").unwrap_or(1).max(0);
        let stub = std::env::var("FAKE_CUDA_STUB")
            .map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        let missing = std::env::var("FAKE_CUDA_MISSING")
            .map(|v| parse_list(&v))
            .unwrap_or_default();
        Config {
            version: AtomicI32::new(version),
            stub: AtomicBool::new(stub),
            devices: AtomicI32::new(devices),
            missing: Mutex::new(missing),
        }
    }

    pub(crate) fn version(&self) -> i32 {
        self.version.load(Ordering::Relaxed)
    }

    pub(crate) fn set_version(&self, version: i32) {
        self.version.store(version, Ordering::Relaxed);
    }

    pub(crate) fn stub(&self) -> bool {
        self.stub.load(Ordering::Relaxed)
    }

    pub(crate) fn set_stub(&self, stub: bool) {
        self.stub.store(stub, Ordering::Relaxed);
    }

    pub(crate) fn devices(&self) -> i32 {
        self.devices.load(Ordering::Relaxed)
    }

    pub(crate) fn set_devices(&self, devices: i32) {
        self.devices.store(devices.max(0), Ordering::Relaxed);
    }

    pub(crate) fn is_missing(&self, symbol: &str) -> bool {
        relock(&self.missing).contains(symbol)
    }

    pub(crate) fn set_missing(&self, list: &str) {
        *relock(&self.missing) = parse_list(list);
    }
}

fn env_number(name: &str) -> Option<i32> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("fake-cuda: ignoring {name}={value:?}: not a number");
            None
        }
    }
}

/// `a, b,c` → {a, b, c}.
pub(crate) fn parse_list(list: &str) -> BTreeSet<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
