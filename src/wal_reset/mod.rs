//! The WAL-reset rule's room: the race of SQLite 3.7.0–3.51.2 (sqlite.org/wal.html#walresetbug),
//! whether the shim's rule against it is on (this file: the setting, public), and a connection's
//! part in it (`slot.rs`). The rule's `xShmLock` callbacks are the shim's
//! (`src/vfs/file/reset_lock.rs`), its tripwire the connection's (`src/vfs/state/tripwire.rs`).
//!
//! The race: a checkpointer holds the checkpoint lock (CKPT) and has read the WAL header; before
//! it compares `nBackfill` with that header's `mxFrame`, a writer resets the WAL (it needs only
//! the read locks 1–4) and commits; the checkpointer then backfills by its stale header and
//! leaves `nBackfill` past the new `mxFrame`, so committed frames are skipped and later lost.
//! The rule (`src/vfs/file/reset_lock.rs`): a connection that does not hold CKPT and asks for the
//! read locks 1–4 exclusively — SQLite's WAL reset — gets them only with CKPT taken first, by the
//! shim, without waiting; if CKPT is busy the answer is `SQLITE_BUSY`, and SQLite appends to the
//! WAL instead of resetting it. docs/architecture.md ("The WAL-reset race") has the reasoning.

use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(target_os = "linux")]
pub(crate) mod slot;

/// SQLite versions with the race, as `sqlite3_libversion_number()` gives them: 3.7.0 (WAL mode)
/// up to 3.51.2, except the fixed backports 3.50.7+ (of 3.50.x) and 3.44.6+ (of 3.44.x).
pub fn sqlite_has_wal_reset_race(version_number: i32) -> bool {
    let in_range = (3_007_000..3_051_003).contains(&version_number);
    let fixed_backport = (3_050_007..3_051_000).contains(&version_number)
        || (3_044_006..3_045_000).contains(&version_number);
    in_range && !fixed_backport
}

/// Whether the shim keeps WAL resets and checkpoints apart (`HERMES_GUARD_WAL_RESET_GUARD`, or
/// [`set_wal_reset_guard`]; per connection, `PRAGMA hermes_guard_wal_reset_guard = on|off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WalResetGuard {
    /// On where the running SQLite has the race ([`sqlite_has_wal_reset_race`]), off where it is
    /// fixed (the default).
    Auto,
    /// On whatever the SQLite version.
    On,
    /// Off: SQLite's own behaviour, race included.
    Off,
}

/// The environment variable read when [`set_wal_reset_guard`] was not called (the loadable
/// extension's hosts): `on`, `off` or `auto` (the default).
pub const WAL_RESET_GUARD_ENV: &str = "HERMES_GUARD_WAL_RESET_GUARD";

/// 0: not set (the environment decides), 1: auto, 2: on, 3: off.
static SETTING: AtomicU8 = AtomicU8::new(0);

/// Chooses the rule's setting for the whole process (overrides [`WAL_RESET_GUARD_ENV`]);
/// connections opened before keep what they decided at their open.
pub fn set_wal_reset_guard(setting: WalResetGuard) {
    let v = match setting {
        WalResetGuard::Auto => 1,
        WalResetGuard::On => 2,
        WalResetGuard::Off => 3,
    };
    SETTING.store(v, Ordering::Release);
}

/// The setting in force: [`set_wal_reset_guard`]'s, else [`WAL_RESET_GUARD_ENV`]'s, else
/// [`WalResetGuard::Auto`].
pub fn wal_reset_guard() -> WalResetGuard {
    match SETTING.load(Ordering::Acquire) {
        1 => WalResetGuard::Auto,
        2 => WalResetGuard::On,
        3 => WalResetGuard::Off,
        _ => match std::env::var(WAL_RESET_GUARD_ENV).as_deref().map(str::trim) {
            Ok("on") => WalResetGuard::On,
            Ok("off") => WalResetGuard::Off,
            _ => WalResetGuard::Auto,
        },
    }
}

/// Whether a connection opened now starts with the rule on: the setting, `Auto` judged from the
/// SQLite the process runs (in an extension, the host's).
pub fn wal_reset_guard_on() -> bool {
    match wal_reset_guard() {
        WalResetGuard::On => true,
        WalResetGuard::Off => false,
        WalResetGuard::Auto => sqlite_has_wal_reset_race(rusqlite::version_number()),
    }
}

#[cfg(test)]
mod tests {
    use super::sqlite_has_wal_reset_race as affected;

    #[test]
    fn versions_before_wal_mode_have_no_race() {
        assert!(!affected(3_006_023));
    }

    #[test]
    fn versions_from_3_7_0_to_3_51_2_have_the_race() {
        for v in [
            3_007_000, 3_040_001, 3_045_001, 3_048_000, 3_050_006, 3_051_002,
        ] {
            assert!(affected(v), "{v}");
        }
    }

    #[test]
    fn the_fixed_releases_and_backports_have_no_race() {
        for v in [
            3_051_003, 3_052_000, 3_054_001, 3_050_007, 3_050_009, 3_044_006,
        ] {
            assert!(!affected(v), "{v}");
        }
    }

    #[test]
    fn other_patch_releases_of_the_backported_lines_have_it() {
        assert!(affected(3_044_005));
        assert!(affected(3_044_000));
        assert!(affected(3_050_000));
    }
}
