//! The one seam between the library and its own tests: every test-only switch a production
//! function consults is read here, in every build. Without the feature that sets it (no
//! application enables `explore-faults` or `test-hooks`), each answer is the constant "off", which
//! the compiler folds away, so the production functions carry no `cfg` branch of their own.

use std::path::Path;

/// The stale-WAL gate's former order (judged first, EXCLUSIVE after): `Some(window)`, called
/// between the judgement and the EXCLUSIVE attempt, when the explorer switched it on.
#[inline]
pub(crate) fn stale_wal_judged_before_exclusive() -> Option<fn()> {
    #[cfg(feature = "explore-faults")]
    return super::explore_faults::stale_wal_judged_before_exclusive();
    #[cfg(not(feature = "explore-faults"))]
    None
}

/// Recovery replays a capture's delta whatever its manifest says of its base (the explorer's
/// switch for recovery's former rule).
#[inline]
pub(crate) fn capture_base_ignored() -> bool {
    #[cfg(feature = "explore-faults")]
    return super::explore_faults::capture_base_ignored();
    #[cfg(not(feature = "explore-faults"))]
    false
}

/// Recovery never picks the `changes` rule (the explorer's switch for recovery without it).
#[inline]
pub(crate) fn changes_ignored() -> bool {
    #[cfg(feature = "explore-faults")]
    return super::explore_faults::changes_ignored();
    #[cfg(not(feature = "explore-faults"))]
    false
}

/// The overwrite judgement without its lock and confirmation (the explorer's switch for its
/// former reading).
#[inline]
pub(crate) fn judgement_unconfirmed() -> bool {
    #[cfg(feature = "explore-faults")]
    return super::explore_faults::judgement_unconfirmed();
    #[cfg(not(feature = "explore-faults"))]
    false
}

/// `HERMES_GUARD_TEST_FS_MAGIC` (hex), which stands for the filesystem's magic number in the
/// crate's own tests (`test-hooks`), to run the refusal on a network filesystem this machine
/// cannot mount. Never read in a normal build.
#[inline]
pub(crate) fn filesystem_magic() -> Option<i64> {
    #[cfg(feature = "test-hooks")]
    {
        let v = std::env::var("HERMES_GUARD_TEST_FS_MAGIC").ok()?;
        i64::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    }
    #[cfg(not(feature = "test-hooks"))]
    None
}

/// The capture failure a test injected for `database` (`test-hooks`, and the crate's unit
/// tests); without them none, and nothing is locked to find that out.
#[inline]
pub(crate) fn injected_capture_fault(database: &Path) -> Option<String> {
    #[cfg(any(test, feature = "test-hooks"))]
    return super::capture_faults::injected(database);
    #[cfg(not(any(test, feature = "test-hooks")))]
    {
        let _ = database;
        None
    }
}
