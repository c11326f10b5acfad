//! The workspace root package: integration tests and examples live beside it.
