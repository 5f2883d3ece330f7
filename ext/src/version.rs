//! The oldest SQLite the extension can run in, checked before anything else at load time.

use std::ffi::c_int;

/// The oldest host SQLite the extension loads into. The routines the shim calls need 3.32.0
/// (`sqlite3_database_file_object`); 3.34.0 is the oldest host it is tested on (CI builds one).
/// A host older than the bindings (3.45.3) gets a padded copy of its API table
/// (`host_api::table_for_rusqlite`), so the binding version does not set the minimum.
pub const MIN_SQLITE_VERSION_NUMBER: c_int = 3_034_000;

/// `3045003` as `3.45.3`.
pub fn dotted(version: c_int) -> String {
    format!(
        "{}.{}.{}",
        version / 1_000_000,
        version / 1_000 % 1_000,
        version % 1_000
    )
}

/// `Err` with the message the host shows when its SQLite (`sqlite3_libversion_number()`) is too
/// old for the extension.
pub fn check_host_version(host: c_int) -> Result<(), String> {
    if host >= MIN_SQLITE_VERSION_NUMBER {
        return Ok(());
    }
    Err(format!(
        "hermes-guard needs SQLite {} or newer, but this program runs SQLite {}; load it into a \
         program built with a newer SQLite (for Python: pip install apsw)",
        dotted(MIN_SQLITE_VERSION_NUMBER),
        dotted(host)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // ext/README.md and ext/build-and-test.sh (the 3.34.0 host it builds) name this version.
    #[test]
    fn the_minimum_is_the_one_the_readme_and_the_ci_script_name() {
        assert_eq!(dotted(MIN_SQLITE_VERSION_NUMBER), "3.34.0");
    }

    #[test]
    fn a_host_at_or_above_the_minimum_is_accepted() {
        assert_eq!(check_host_version(MIN_SQLITE_VERSION_NUMBER), Ok(()));
        assert_eq!(check_host_version(3_054_001), Ok(()));
    }

    #[test]
    fn a_host_below_the_minimum_gets_both_versions_in_the_message() {
        let err = check_host_version(3_033_000).unwrap_err();
        assert!(
            err.contains("needs SQLite 3.34.0 or newer, but this program runs SQLite 3.33.0"),
            "{err}"
        );
        assert!(check_host_version(MIN_SQLITE_VERSION_NUMBER - 1).is_err());
    }
}
