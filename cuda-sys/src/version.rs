//! Driver and ABI version numbers: `1000 * major + 10 * minor`, as `cuDriverGetVersion` reports them.

use std::fmt;

/// A CUDA version number as the driver reports it (`13000` is CUDA 13.0, `12030` is 12.3).
///
/// It wraps an `i32` because the driver writes its version into a C `int`
/// (`cuDriverGetVersion`) and `cuGetProcAddress` takes one; the table's ABI versions
/// ([`FunctionInfo::version`](crate::FunctionInfo::version),
/// [`Error::DriverTooOld`](crate::Error::DriverTooOld)'s `required`) are `u32`, as an ABI version
/// is never negative: `DriverVersion(version as i32)` turns one into the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// The major version (`13` for `13000`).
    pub fn major(self) -> i32 {
        self.0 / 1000
    }

    /// The minor version (`2` for `13020`).
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

#[cfg(test)]
mod tests {
    use super::DriverVersion;

    #[test]
    fn version_numbers_print_as_major_dot_minor() {
        assert_eq!(DriverVersion(13000).to_string(), "13.0");
        assert_eq!(DriverVersion(12030).to_string(), "12.3");
        assert_eq!(DriverVersion(9020).to_string(), "9.2");
        assert_eq!(DriverVersion(13010).minor(), 1);
    }
}
