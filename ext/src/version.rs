//! The oldest SQLite the extension can run in, checked before anything else at load time.

use std::ffi::c_int;

use rusqlite::ffi;

/// What the shim itself calls for: `sqlite3_database_file_object` (3.34.0) maps a WAL's
/// filename to its main file object.
const SHIM_NEEDS: c_int = 3_034_000;

/// The oldest host SQLite the extension loads into: the newer of what the shim calls for and the
/// version of the API table the bindings were generated from (rusqlite reads every slot of that
/// table, and an older host's table is shorter).
pub const MIN_SQLITE_VERSION_NUMBER: c_int = if ffi::SQLITE_VERSION_NUMBER > SHIM_NEEDS {
    ffi::SQLITE_VERSION_NUMBER
} else {
    SHIM_NEEDS
};

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
         program built with a newer SQLite (for Python: pip install --upgrade apsw)",
        dotted(MIN_SQLITE_VERSION_NUMBER),
        dotted(host)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // ext/README.md and ext/build-and-test.sh (MINIMUM_APSW) name this version: a rusqlite
    // upgrade that moves it must move them too.
    #[test]
    fn the_minimum_is_the_one_the_readme_and_the_ci_script_name() {
        assert_eq!(dotted(MIN_SQLITE_VERSION_NUMBER), "3.45.3");
    }

    #[test]
    fn a_host_at_or_above_the_minimum_is_accepted() {
        assert_eq!(check_host_version(MIN_SQLITE_VERSION_NUMBER), Ok(()));
        assert_eq!(check_host_version(3_054_001), Ok(()));
    }

    #[test]
    fn a_host_below_the_minimum_gets_both_versions_in_the_message() {
        let err = check_host_version(3_044_002).unwrap_err();
        assert!(
            err.contains("needs SQLite 3.45.3 or newer, but this program runs SQLite 3.44.2"),
            "{err}"
        );
        assert!(check_host_version(MIN_SQLITE_VERSION_NUMBER - 1).is_err());
    }
}
