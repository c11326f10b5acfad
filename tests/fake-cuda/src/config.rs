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
    /// The settings the environment gave at load, for [`Config::reset`].
    at_load: Settings,
}

/// The settings as the environment gives them.
struct Settings {
    version: i32,
    stub: bool,
    devices: i32,
    missing: BTreeSet<String>,
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            version: env_number("FAKE_CUDA_VERSION").unwrap_or(DEFAULT_VERSION),
            devices: env_number("FAKE_CUDA_DEVICES").unwrap_or(1).max(0),
            stub: std::env::var("FAKE_CUDA_STUB")
                .map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
                .unwrap_or(false),
            missing: std::env::var("FAKE_CUDA_MISSING")
                .map(|v| parse_list(&v))
                .unwrap_or_default(),
        }
    }
}

static CONFIG: LazyLock<Config> = LazyLock::new(Config::from_env);

pub(crate) fn config() -> &'static Config {
    &CONFIG
}

impl Config {
    fn from_env() -> Config {
        let at_load = Settings::from_env();
        Config {
            version: AtomicI32::new(at_load.version),
            stub: AtomicBool::new(at_load.stub),
            devices: AtomicI32::new(at_load.devices),
            missing: Mutex::new(at_load.missing.clone()),
            at_load,
        }
    }

    /// Puts the version, the stub mode, the device count and the missing symbols back as the
    /// environment gave them at load.
    pub(crate) fn reset(&self) {
        let at_load = &self.at_load;
        self.set_version(at_load.version);
        self.set_stub(at_load.stub);
        self.set_devices(at_load.devices);
        *relock(&self.missing) = at_load.missing.clone();
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
