//! The explorer's tests, one binary (linked once), a module each: its own checks (explore.rs),
//! and the rediscoveries of the guard bugs it found, each with a process-wide switch (a fault of
//! the guard's `explore-faults` feature, or the WAL-reset rule): a test that sets one runs
//! alone ([`alone`]), every other test holds [`shared`] while it runs schedules.

mod churn;
mod explore;
mod newer_changes;
mod newer_generation;
mod stale_wal_order;
mod wal_reset;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static PROCESS_WIDE: RwLock<()> = RwLock::new(());

/// For a test that switches a process-wide setting: no other test runs schedules meanwhile.
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    PROCESS_WIDE.write().unwrap_or_else(|e| e.into_inner())
}

/// For a test that runs schedules with the settings as they are.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    PROCESS_WIDE.read().unwrap_or_else(|e| e.into_inner())
}
