//! The inputs read from a capture directory (manifest, `<file>-wal`, `<file>-base`, image)
//! give the same pages and changes as the same bytes given directly; a base file of another
//! generation, or a damaged one, or a missing WAL, is a typed error.

use super::tests::run;
use super::*;

#[test]
fn a_capture_directory_gives_the_same_changes_as_its_parts() {
    use crate::capture::{
        base_file, BasePagesEntry, ImageMode, MainEntry, Manifest, PathGeneration, Trigger,
        WalEntry,
    };
    use crate::walfile::{parse_main_header, summarize_wal};
    let run = run(super::tests::setup, super::tests::ops);
    let mut pages = run.pages();
    pages.freed = run.freed();
    let capture = run.dir.path().join("capture");
    std::fs::create_dir(&capture).unwrap();
    std::fs::write(capture.join("g.db-wal"), &run.wal).unwrap();
    std::fs::write(capture.join("g.db"), &run.snapshot).unwrap();
    let mut base = Vec::new();
    base_file::write(&mut base, &run.base_pages()).unwrap();
    std::fs::write(capture.join("g.db-base"), &base).unwrap();
    let summary = summarize_wal(&run.wal);
    let id = crate::identity::FileId { dev: 1, ino: 2 };
    let manifest = Manifest {
        version: 1,
        database: "g.db".into(),
        database_hex: None,
        trigger: Trigger::Halt,
        reason: None,
        pid: 1,
        captured_at: "2026-01-01T00:00:00Z".into(),
        sqlite: rusqlite::version().to_owned(),
        wal: WalEntry {
            identity: id,
            file: "g.db-wal".into(),
            bytes: run.wal.len() as u64,
            sha256: String::new(),
            header: summary.header.clone(),
            frames: summary.frames,
            commits: summary.commits,
            last_commit_frame: summary.last_commit_frame,
            generation: None,
            failed_commit: None,
        },
        shm: None,
        main: MainEntry {
            identity: Some(id),
            size: run.snapshot.len() as u64,
            header: parse_main_header(&run.snapshot),
            mode: ImageMode::Copied,
            file: "g.db".into(),
            bytes: run.snapshot.len() as u64,
            sha256: String::new(),
        },
        path_generation_at_capture: PathGeneration {
            main: None,
            wal: None,
            shm: None,
            wal_salts: None,
        },
        backfill_at_loss: Some(crate::status::Backfill {
            frames: summary.frames as u32,
            backfilled: 0,
            attempted: 0,
        }),
        main_torn: false,
        stale_wal: None,
        base: None,
        base_pages: Some(BasePagesEntry {
            file: "g.db-base".into(),
            bytes: base.len() as u64,
            sha256: String::new(),
            page_size: 1024,
            salts: run.base_pages().salts,
            pages_at_start: run.base_pages().pages_at_start,
            kept: run.base_pages().pages.len() as u64,
            over_cap: 0,
        }),
    };
    std::fs::write(
        capture.join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    let mut from_capture = GenerationPages::from_capture(&capture, 0).unwrap();
    assert_eq!(from_capture.final_pages, pages.final_pages);
    assert_eq!(from_capture.base, pages.base);
    from_capture.freed = pages.freed.clone();
    let image = pages::capture_image(&capture).unwrap().unwrap();
    assert_eq!(image, run.snapshot);
    assert_eq!(
        compute(&from_capture, None).tables,
        compute(&pages, None).tables
    );
    // A base file of another generation is refused.
    let mut other = run.base_pages();
    other.salts[0] ^= 1;
    assert!(matches!(
        GenerationPages::from_parts(&run.wal, Some(&other), Some(0)),
        Err(ChangesError::Salts { .. })
    ));
    std::fs::write(capture.join("g.db-base"), b"not a base file").unwrap();
    assert!(matches!(
        GenerationPages::from_capture(&capture, 0),
        Err(ChangesError::BaseFile { .. })
    ));
    std::fs::remove_file(capture.join("g.db-wal")).unwrap();
    assert!(matches!(
        GenerationPages::from_capture(&capture, 0),
        Err(ChangesError::Read { .. })
    ));
}
