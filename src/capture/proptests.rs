//! Property tests (`proptest`) of the capture's names and of `manifest.json`: every name fits
//! `NAME_MAX` and is a single path component; no input makes the manifest reader panic; a
//! manifest written as `write_capture` writes it reads back equal.

use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use proptest::prelude::*;

use super::names::NAME_MAX;
use super::*;
use crate::status::{Backfill, RetireReason};
use crate::walfile::{encode_test_wal, parse_main_header, summarize_wal};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A Linux file name: 1 to 255 bytes, none of them `/` or NUL; biased towards multi-byte UTF-8
/// and invalid sequences, which are where a cut can go wrong.
fn file_name() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => (1u8..=255).prop_filter("no '/'", |b| *b != b'/'),
        1 => Just(0xffu8),
        1 => Just(0xc3u8),
        1 => Just(0xa9u8),
    ];
    let chunk = prop_oneof![
        3 => byte.prop_map(|b| vec![b]),
        1 => any::<char>()
            .prop_filter("no '/' or NUL", |c| *c != '/' && *c != '\0')
            .prop_map(|c| c.to_string().into_bytes()),
    ];
    prop::collection::vec(chunk, 1..255).prop_map(|chunks| {
        let mut name: Vec<u8> = chunks.concat();
        name.truncate(NAME_MAX);
        name
    })
}

/// The longest directory name `reserve_staging` can make of `stem`: the marker, the stamp, the
/// largest pid and counter, and `.partial`.
fn longest_dir_name(stem: &str) -> usize {
    format!(
        "{stem}{ARTIFACT_MARKER}20261130-005320-{}-{}{STAGING_SUFFIX}",
        u32::MAX,
        u32::MAX
    )
    .len()
}

fn file_id() -> impl Strategy<Value = crate::identity::FileId> {
    any::<[u64; 2]>().prop_map(crate::identity::FileId::from)
}

fn reason() -> impl Strategy<Value = RetireReason> {
    prop_oneof![
        Just(RetireReason::WalLost),
        Just(RetireReason::ShmLost),
        Just(RetireReason::MainReplaced),
        Just(RetireReason::StaleWal),
    ]
}

fn backfill() -> impl Strategy<Value = Backfill> {
    any::<[u32; 3]>().prop_map(|[frames, backfilled, attempted]| Backfill {
        frames,
        backfilled,
        attempted,
    })
}

/// A manifest as `fill_staging` makes one, every field drawn at random (the `stale_wal` part,
/// which only the stale-WAL capture writes, is left out).
fn manifest() -> impl Strategy<Value = Manifest> {
    let who = (
        any::<String>(),
        prop::option::of("[0-9a-f]{0,64}"),
        prop_oneof![
            Just(Trigger::Halt),
            Just(Trigger::Close),
            Just(Trigger::Open)
        ],
        prop::option::of(reason()),
        any::<u32>(),
        any::<String>(),
    );
    let wal = (
        file_id(),
        any::<String>(),
        any::<u64>(),
        "[0-9a-f]{64}",
        any::<u64>(),
        any::<u8>(),
    );
    let main = (
        prop::option::of(file_id()),
        any::<u64>(),
        prop_oneof![Just(ImageMode::Copied), Just(ImageMode::Absent)],
        any::<String>(),
        "[0-9a-f]{64}",
        prop::collection::vec(any::<u8>(), 0..120),
    );
    let rest = (
        prop::option::of(file_id()),
        prop::option::of(backfill()),
        any::<bool>(),
        prop::array::uniform3(prop::option::of(file_id())),
    );
    (who, wal, main, rest).prop_map(
        |(
            (database, database_hex, trigger, reason, pid, captured_at),
            (wal_id, wal_file, wal_bytes, wal_sha, wal_frames, seed),
            (main_id, size, mode, main_file, main_sha, header),
            (shm, backfill_at_loss, main_torn, [pm, pw, ps]),
        )| {
            let summary = summarize_wal(&encode_test_wal(
                512,
                [u32::from(seed), 7],
                &[(1, u32::from(seed % 2), vec![seed; 8])],
                seed % 3 == 0,
            ));
            Manifest {
                version: 1,
                database,
                database_hex,
                trigger,
                reason,
                pid,
                captured_at,
                sqlite: rusqlite::version().to_owned(),
                wal: WalEntry {
                    identity: wal_id,
                    file: wal_file,
                    bytes: wal_bytes,
                    sha256: wal_sha,
                    header: summary.header.clone(),
                    frames: wal_frames,
                    commits: summary.commits,
                    last_commit_frame: summary.last_commit_frame,
                    generation: crate::walfile::generation_id(
                        &summary.header,
                        summary.first_frame_checksum,
                    ),
                    failed_commit: None,
                },
                shm: shm.map(|identity| ShmEntry { identity }),
                main: MainEntry {
                    identity: main_id,
                    size,
                    header: parse_main_header(&header),
                    mode,
                    file: main_file,
                    bytes: size,
                    sha256: main_sha,
                },
                path_generation_at_capture: PathGeneration {
                    main: pm,
                    wal: pw,
                    shm: ps,
                    wal_salts: None,
                },
                backfill_at_loss,
                main_torn,
                stale_wal: None,
                base: None,
                base_pages: None,
            }
        },
    )
}

/// Any JSON value, a few levels deep.
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Reads `bytes` as the manifest of a capture directory, through [`Manifest::read`].
fn read_back(bytes: &[u8]) -> Result<Manifest, super::ManifestError> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(MANIFEST_NAME), bytes).expect("write manifest");
    Manifest::read(dir.path())
}

proptest! {
    #![proptest_config(config(256))]

    /// Both names derived from any file name fit `NAME_MAX` with everything appended to them,
    /// are single path components (no `/`, no NUL) and are never empty; a UTF-8 name that fits
    /// (and does not end as a shortened name does) is kept as it is, any other keeps a hash of
    /// the whole name.
    #[test]
    fn capture_names_fit_name_max_and_are_one_component(raw in file_name()) {
        let name = OsStr::from_bytes(&raw);
        let stem = capture_dir_stem(name);
        let file = capture_file_name(name);
        prop_assert!(longest_dir_name(&stem) <= NAME_MAX, "{} bytes: {:?}", stem.len(), stem);
        prop_assert!(stem.len() <= DIR_STEM_MAX);
        prop_assert!(file.len() + "-journal".len() <= NAME_MAX, "{:?}", file);
        prop_assert!(file.len() <= FILE_STEM_MAX);
        for derived in [&stem, &file] {
            prop_assert!(!derived.is_empty());
            prop_assert!(!derived.contains('/') && !derived.contains('\0'), "{:?}", derived);
        }
        for (derived, max) in [(&stem, DIR_STEM_MAX), (&file, FILE_STEM_MAX)] {
            match std::str::from_utf8(&raw) {
                Ok(s) if s.len() <= max && !ends_like_a_shortened_name(s) => {
                    prop_assert_eq!(derived.as_str(), s)
                }
                _ => {
                    let tail = format!("~{}", &crate::paths::hex(&Sha256::digest(&raw))[..16]);
                    prop_assert!(derived.ends_with(&tail), "{:?}", derived);
                }
            }
        }
    }

    /// Two different names never share a derived name: kept or shortened, and a kept name never
    /// equals another's shortened form (the second name is often the first one's shortened form:
    /// the case the property tests first found colliding).
    #[test]
    fn different_names_never_share_a_derived_name(a in file_name(), b in file_name(), lookalike in any::<bool>()) {
        for f in [capture_dir_stem as fn(&OsStr) -> String, capture_file_name] {
            let b = if lookalike { f(OsStr::from_bytes(&a)).into_bytes() } else { b.clone() };
            prop_assume!(a != b);
            prop_assert_ne!(f(OsStr::from_bytes(&a)), f(OsStr::from_bytes(&b)));
        }
    }

    /// Arbitrary bytes and arbitrary JSON never make the manifest reader panic.
    #[test]
    fn arbitrary_input_never_panics_the_manifest_reader(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        value in json(),
    ) {
        let _ = serde_json::from_slice::<Manifest>(&bytes);
        let _ = read_back(&bytes);
        let text = serde_json::to_vec(&value).expect("a Value always serialises");
        prop_assert!(read_back(&text).is_err() || value.is_object());
    }

    /// A valid manifest with one field replaced by arbitrary JSON is read or refused, never a
    /// panic; the reader's error names the file.
    #[test]
    fn a_manifest_with_a_field_replaced_is_read_or_refused(
        manifest in manifest(),
        field in any::<prop::sample::Index>(),
        value in json(),
    ) {
        let mut tree = serde_json::to_value(&manifest).expect("serialise");
        let object = tree.as_object_mut().expect("an object");
        let key = object.keys().nth(field.index(object.len())).cloned().expect("a key");
        object.insert(key, value);
        let bytes = serde_json::to_vec_pretty(&tree).expect("serialise");
        if let Err(e) = read_back(&bytes) {
            prop_assert!(e.to_string().contains(MANIFEST_NAME), "{}", e);
        }
    }
}

proptest! {
    // Each case writes a directory: fewer of them.
    #![proptest_config(config(64))]

    /// A manifest written as `write_capture` writes it (pretty JSON) reads back equal.
    #[test]
    fn a_written_manifest_reads_back_equal(manifest in manifest()) {
        let bytes = serde_json::to_vec_pretty(&manifest).expect("serialise");
        prop_assert_eq!(read_back(&bytes).expect("read back"), manifest);
    }

    /// `reserve_staging` gives every reservation of a stem, and of different stems, a name of
    /// its own, each within `NAME_MAX` once staged.
    #[test]
    fn reserved_names_are_unique_per_stem_and_counter(
        names in prop::collection::vec(file_name(), 1..4),
        per_stem in 1usize..4,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let fd = crate::paths::open_dir(rustix::fs::CWD, dir.path()).expect("open dir");
        let mut seen = std::collections::HashSet::new();
        for raw in &names {
            let stem = capture_dir_stem(OsStr::from_bytes(raw));
            for _ in 0..per_stem {
                let private = crate::permissions::Permissions::most_private();
                let (name, staging) =
                    reserve_staging(fd.as_fd(), &stem, &private).expect("reserve");
                prop_assert!(staging.len() <= NAME_MAX, "{:?}", staging);
                prop_assert_eq!(&staging, &format!("{name}{STAGING_SUFFIX}"));
                let prefix = format!("{stem}{ARTIFACT_MARKER}");
                prop_assert!(name.starts_with(&prefix));
                prop_assert!(seen.insert(name.clone()), "{:?} reserved twice", name);
            }
        }
    }
}

/// `~` and 16 lowercase hex digits at the end: the tail of a shortened name.
fn ends_like_a_shortened_name(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 16
        && b[b.len() - 17] == b'~'
        && b[b.len() - 16..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}
