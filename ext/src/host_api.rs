//! The host's `sqlite3_api_routines` as rusqlite's bindings want it.
//!
//! rusqlite's `loadable_extension` is generated from SQLite 3.45.3's `sqlite3ext.h`:
//! `rusqlite_extension_init2` refuses a host whose `sqlite3_libversion_number()` is older, and
//! then copies every slot of the 3.45.3 table. An older host's table is shorter (each release
//! appends slots; `sqlite3ext.h` marks them "Version x.y.z and later"), so reading it as a 3.45.3
//! table would read past its end. For such a host the extension hands rusqlite a full-size,
//! zero-filled copy holding only the host's own slots ([`table_for_rusqlite`]).

use std::ffi::c_int;
use std::mem::{offset_of, size_of};
use std::ptr;

use rusqlite::ffi;

type Routines = ffi::sqlite3_api_routines;

/// Bytes of `sqlite3_api_routines` a host of version `host` has: the slots before the first one
/// added after it (the "Version x.y.z and later" groups of `sqlite3ext.h`), or the whole table
/// for a host at least as new as the bindings.
pub fn api_table_len(host: c_int) -> usize {
    // (first version that has the group, offset of the group's first slot), oldest first. The
    // groups before 3.34.0 are not listed: an older host is refused before the table is read.
    let groups: [(c_int, usize); 8] = [
        (3_036_001, offset_of!(Routines, changes64)),
        (3_037_000, offset_of!(Routines, autovacuum_pages)),
        (3_038_000, offset_of!(Routines, error_offset)),
        (3_039_000, offset_of!(Routines, deserialize)),
        (3_040_000, offset_of!(Routines, value_encoding)),
        (3_041_000, offset_of!(Routines, is_interrupted)),
        (3_043_000, offset_of!(Routines, stmt_explain)),
        (3_044_000, offset_of!(Routines, get_clientdata)),
    ];
    groups
        .iter()
        .find(|(since, _)| host < *since)
        .map_or(size_of::<Routines>(), |&(_, offset)| offset)
}

/// The routines the extension calls, itself or through the rusqlite paths it takes (open a
/// `Connection` on a handle, scalar functions, queries, the VFS registration, the logger). A
/// host that lacks one (an `SQLITE_OMIT_*` build) is refused at load time: rusqlite's wrapper of
/// a missing routine panics (`assert!(!ptr.is_null())`), in places no `catch_unwind` covers.
pub fn missing_routines(table: &Routines) -> Vec<&'static str> {
    let mut missing = Vec::new();
    macro_rules! require {
        ($($slot:ident)*) => {
            $(if table.$slot.is_none() {
                missing.push(concat!("sqlite3_", stringify!($slot)));
            })*
        };
    }
    require!(
        auto_extension bind_blob64 bind_double bind_int64 bind_null bind_parameter_count
        bind_text64 bind_zeroblob64 close column_blob column_bytes column_count column_double
        column_int64 column_name column_text column_type context_db_handle create_function_v2
        database_file_object errcode errmsg error_offset errstr extended_errcode finalize free
        libversion libversion_number log malloc malloc64 prepare_v3 reset result_blob64
        result_double result_error result_error_code result_int64 result_null result_subtype
        result_text64 result_value result_zeroblob64 step user_data value_blob value_bytes
        value_double value_int64 value_text value_type vfs_find vfs_register
    );
    missing
}

/// What the extension passes to `rusqlite_extension_init2`: the host's own table when it is at
/// least as new as the bindings, otherwise `copy` filled with the host's slots, the later ones
/// NULL, `libversion_number` answering the bindings' version (rusqlite's check; what rusqlite
/// and the shim report as the version comes from `sqlite3_libversion`, the host's own), and
/// `error_offset` (3.38, called by rusqlite after a failed prepare) answering -1, "no offset",
/// when the host lacks it.
///
/// # Safety
/// `p_api` is the host's API table of SQLite `host_version`, as passed to the entry point.
pub unsafe fn table_for_rusqlite(
    p_api: *mut Routines,
    host_version: c_int,
    copy: &mut Routines,
) -> *mut Routines {
    if host_version >= ffi::SQLITE_VERSION_NUMBER {
        return p_api;
    }
    let len = api_table_len(host_version);
    // SAFETY: a table of `Option<fn>` slots, for which all-zero bytes are `None`.
    *copy = unsafe { std::mem::zeroed() };
    // SAFETY: the host's table of that version has at least `len` bytes (its own slots); `copy`
    // has `size_of::<Routines>() >= len` and does not overlap it.
    unsafe { ptr::copy_nonoverlapping(p_api as *const u8, ptr::from_mut(copy) as *mut u8, len) };
    copy.libversion_number = Some(bindings_version);
    if copy.error_offset.is_none() {
        copy.error_offset = Some(no_error_offset);
    }
    ptr::from_mut(copy)
}

unsafe extern "C" fn bindings_version() -> c_int {
    ffi::SQLITE_VERSION_NUMBER
}

unsafe extern "C" fn no_error_offset(_db: *mut ffi::sqlite3) -> c_int {
    -1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_at_or_after_the_bindings_has_the_whole_table() {
        assert_eq!(
            api_table_len(ffi::SQLITE_VERSION_NUMBER),
            size_of::<Routines>()
        );
        assert_eq!(api_table_len(3_054_001), size_of::<Routines>());
        assert_eq!(api_table_len(3_044_000), size_of::<Routines>());
    }

    #[test]
    fn an_older_host_ends_before_the_first_group_added_after_it() {
        // 3.34.0 and 3.36.0 end with txn_state (3.34.0): changes64 came in 3.36.1.
        assert_eq!(api_table_len(3_034_000), offset_of!(Routines, changes64));
        assert_eq!(api_table_len(3_036_000), offset_of!(Routines, changes64));
        assert_eq!(
            api_table_len(3_036_001),
            offset_of!(Routines, autovacuum_pages)
        );
        // Debian 12 (3.40.1) has value_encoding (3.40.0), not is_interrupted (3.41.0).
        assert_eq!(
            api_table_len(3_040_001),
            offset_of!(Routines, is_interrupted)
        );
        assert_eq!(
            api_table_len(3_043_002),
            offset_of!(Routines, get_clientdata)
        );
    }

    #[test]
    fn a_table_ends_after_the_last_slot_of_its_version() {
        let slot = size_of::<Option<unsafe extern "C" fn()>>();
        assert_eq!(
            api_table_len(3_034_000),
            offset_of!(Routines, txn_state) + slot
        );
        assert_eq!(
            api_table_len(3_038_000),
            offset_of!(Routines, deserialize),
            "3.38.0 has error_offset"
        );
        assert!(api_table_len(3_038_000) > offset_of!(Routines, error_offset));
    }

    #[test]
    fn the_lengths_grow_with_the_version() {
        let versions = [
            3_034_000, 3_036_001, 3_037_000, 3_038_000, 3_039_000, 3_040_000, 3_041_000, 3_043_000,
            3_044_000,
        ];
        for pair in versions.windows(2) {
            assert!(api_table_len(pair[0]) < api_table_len(pair[1]), "{pair:?}");
        }
    }

    #[test]
    fn an_empty_table_lacks_everything_and_names_it() {
        // SAFETY: all-zero bytes are `None` in every slot.
        let table: Routines = unsafe { std::mem::zeroed() };
        let missing = missing_routines(&table);
        assert!(
            missing.contains(&"sqlite3_database_file_object"),
            "{missing:?}"
        );
        assert!(missing.contains(&"sqlite3_vfs_register"), "{missing:?}");
    }

    #[test]
    fn an_older_hosts_copy_has_the_stand_ins_and_only_its_own_slots() {
        // A fake 3.34.0 host: its table is the 3.34.0 prefix, every slot set.
        let len = api_table_len(3_034_000);
        let mut host = vec![0u8; len];
        let filler = no_error_offset as unsafe extern "C" fn(*mut ffi::sqlite3) -> c_int;
        let filler = filler as usize;
        for chunk in host.chunks_exact_mut(size_of::<usize>()) {
            chunk.copy_from_slice(&filler.to_ne_bytes());
        }
        // SAFETY: all-zero bytes are `None` in every slot.
        let mut copy: Routines = unsafe { std::mem::zeroed() };
        // SAFETY: `host` holds `len` bytes, the table of a 3.34.0 host.
        let table = unsafe { table_for_rusqlite(host.as_mut_ptr().cast(), 3_034_000, &mut copy) };
        assert_eq!(table, ptr::from_mut(&mut copy));
        assert!(copy.txn_state.is_some() && copy.database_file_object.is_some());
        assert!(copy.changes64.is_none() && copy.get_clientdata.is_none());
        assert!(copy.error_offset.is_some());
        // SAFETY: the stand-in, which takes no argument it reads.
        let version = unsafe { copy.libversion_number.unwrap()() };
        assert_eq!(version, ffi::SQLITE_VERSION_NUMBER);
        assert!(
            missing_routines(&copy).is_empty(),
            "{:?}",
            missing_routines(&copy)
        );
    }
}
