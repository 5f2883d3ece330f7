//! `verify` reads the capture's bytes, not its manifest: a WAL byte flipped and the manifest's
//! sha256 edited to match still fails, and `recover` says which commits it could not use and
//! never exits as a clean success.

use crate::common;
use crate::recover_cli::{cli, file_bytes, lost_rows, os};

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use rusqlite::Connection;
use sha2::{Digest, Sha256};

/// Frame header and page sizes of the test databases (SQLite's default page size).
const FRAME_HEADER: usize = 24;
const WAL_HEADER: usize = 32;

/// A copy of `artifact` in `dir/name` with one byte of the page of WAL frame `frame` (1-based)
/// flipped and `manifest.json`'s WAL sha256 edited to match the changed bytes.
pub(crate) fn tampered_copy(artifact: &Path, dir: &Path, name: &str, frame: usize) -> PathBuf {
    let copy = dir.join(name);
    fs::create_dir(&copy).unwrap();
    for f in fs::read_dir(artifact).unwrap().flatten() {
        fs::copy(f.path(), copy.join(f.file_name())).unwrap();
    }
    let mut manifest = manifest(&copy);
    let page_size = manifest["wal"]["header"]["page_size"].as_u64().unwrap() as usize;
    let wal_path = copy.join(manifest["wal"]["file"].as_str().unwrap());
    let mut wal = fs::read(&wal_path).unwrap();
    let at = WAL_HEADER + (frame - 1) * (FRAME_HEADER + page_size) + FRAME_HEADER + 100;
    wal[at] ^= 0x20;
    fs::write(&wal_path, &wal).unwrap();
    let sha: String = Sha256::digest(&wal)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    manifest["wal"]["sha256"] = sha.into();
    fs::write(
        copy.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    copy
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn an_intact_capture_verifies_from_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, artifact) = lost_rows(dir.path(), 6);
    let (code, out, _) = cli(&[os("verify"), artifact.as_os_str(), os("--json")]);
    assert_eq!(code, 0, "{out}");
    let v = json(&out);
    let m = manifest(&artifact);
    assert_eq!(v["ok"], true);
    assert_eq!(v["wal_check"]["commits"], m["wal"]["commits"], "{out}");
    assert_eq!(v["wal_check"]["frames"], m["wal"]["frames"], "{out}");
    assert!(v["wal_check"]["commits"].as_u64().unwrap() >= 6, "{out}");
    assert_eq!(v["wal_check"]["commits_after"], 0);
    assert_eq!(v["unreadable_commits"], 0);
    assert_eq!(v["problems"], serde_json::json!([]));
    assert_eq!(v["integrity"], serde_json::json!(["ok"]));
}

#[test]
fn a_tampered_capture_with_a_matching_sha256_fails_verify_and_recover_reports_what_it_cannot_read()
{
    let dir = tempfile::tempdir().unwrap();
    let (path, artifact) = lost_rows(dir.path(), 12);
    let frames = manifest(&artifact)["wal"]["frames"].as_u64().unwrap() as usize;
    let commits = manifest(&artifact)["wal"]["commits"].as_u64().unwrap();
    let broken = frames / 2 + 1;
    let tampered = tampered_copy(&artifact, dir.path(), "tampered", broken);

    // verify: not verified, from the bytes, naming the frame and the commits lost.
    let (code, out, _) = cli(&[os("verify"), tampered.as_os_str()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("NOT verified"), "{out}");
    assert!(
        out.contains(&format!(
            "the manifest says {frames} frame(s) and {commits} commit(s)"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("frame {broken} was changed")),
        "{out}"
    );
    let (code, out, _) = cli(&[os("verify"), tampered.as_os_str(), os("--json")]);
    assert_eq!(code, 1, "{out}");
    let v = json(&out);
    assert_eq!(v["ok"], false);
    assert_eq!(v["wal_check"]["frames"], broken as u64 - 1);
    assert_eq!(v["wal_check"]["prefix_end"], "checksum");
    let readable = v["wal_check"]["commits"].as_u64().unwrap();
    let unreadable = v["unreadable_commits"].as_u64().unwrap();
    assert!(readable > 0 && unreadable > 0, "{out}");
    assert_eq!(readable + unreadable, commits, "{out}");
    assert_eq!(
        v["wal_check"]["frames_after_intact"],
        (frames - broken) as u64,
        "the frames after the flipped one still chain: {out}"
    );

    // captures: the tampered one (named as a capture beside the database) makes it exit 1.
    let beside = dir.path().join("state.db.retired-wal-20200101-000000-7");
    fs::rename(&tampered, &beside).unwrap();
    let (code, out, _) = cli(&[os("captures"), path.as_os_str(), os("--json")]);
    assert_eq!(code, 1, "{out}");
    let list = json(&out);
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["capture"] == beside.display().to_string())
        .unwrap();
    assert_eq!(row["verified"], false, "{row}");
    assert_eq!(row["unreadable_commits"], unreadable, "{row}");
    let tampered = beside;

    // recover: the plan and the merge use the readable commits and exit 3, saying so.
    let before = file_bytes(&path);
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            os("recover"),
            tampered.as_os_str(),
            os("--into"),
            path.as_os_str(),
        ];
        a.extend(extra.iter().map(|s| os(s)));
        a
    };
    let (code, out, _) = cli(&args(&["--json"]));
    assert_eq!(code, 3, "{out}");
    let plan = json(&out);
    assert_eq!(plan["exit_code"], 3);
    assert_eq!(plan["commits_used"], readable);
    assert_eq!(plan["unreadable_commits"], unreadable);
    let missing = plan["missing"].as_u64().unwrap();
    assert!(missing > 0 && missing < 12, "{out}");
    assert_eq!(file_bytes(&path), before, "a plan writes nothing");

    let (code, out, _) = cli(&args(&["--apply"]));
    assert_eq!(code, 3, "never a clean success: {out}");
    assert!(
        out.contains(&format!(
            "{readable} of {commits} commit(s) readable: {unreadable} cannot be read"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("merged {missing} row(s)")), "{out}");
    assert!(out.contains("commits the capture cannot read"), "{out}");
    let live = Connection::open(&path).unwrap();
    assert_eq!(count_like(&live, "retired %") as u64, missing);
    assert!(integrity_ok(&live));

    // The intact capture still gives the rest, and then there is nothing left.
    let (code, out, _) = cli(&[
        os("recover"),
        artifact.as_os_str(),
        os("--into"),
        path.as_os_str(),
        os("--apply"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("merged   before up to WAL frame"), "{out}");
    assert!(
        out.contains(&format!("merged {} row(s)", 12 - missing)),
        "{out}"
    );
    assert_eq!(count_like(&live, "retired %"), 12);
}

#[test]
fn the_library_verifies_from_the_bytes_too() {
    use hermes_guard::recover::{self, PrefixEnd};
    let dir = tempfile::tempdir().unwrap();
    let (_path, artifact) = lost_rows(dir.path(), 8);
    let intact = recover::verify_capture(&artifact).unwrap();
    assert!(intact.verified(), "{:?}", intact.problems);
    assert_eq!(intact.unreadable_commits, 0);
    assert_eq!(intact.wal_check.prefix_end, PrefixEnd::EndOfFile);
    assert_eq!(intact.wal_check.commits, intact.manifest.wal.commits);

    let frames = intact.manifest.wal.frames as usize;
    let tampered = tampered_copy(&artifact, dir.path(), "tampered", frames - 2);
    let check = recover::verify_capture(&tampered).unwrap();
    assert!(!check.verified());
    assert_eq!(check.wal_check.frames, frames as u64 - 3);
    assert_eq!(check.wal_check.prefix_end, PrefixEnd::Checksum);
    assert!(check.unreadable_commits >= 1, "{:?}", check.wal_check);
    assert_eq!(
        check.wal_check.commits + check.unreadable_commits,
        intact.manifest.wal.commits
    );
    assert_eq!(
        check.wal.sha256, check.manifest.wal.sha256,
        "the sha256 was made to match"
    );
    assert!(
        check
            .problems
            .iter()
            .any(|p| p.contains("cannot read them")),
        "{:?}",
        check.problems
    );
}

/// The manifest records the WAL generation the capture holds (`wal.generation`), and `verify` reads
/// it again from the bytes: a manifest naming another generation fails.
#[test]
fn a_manifest_naming_another_wal_generation_fails_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, artifact) = lost_rows(dir.path(), 6);
    let mut m = manifest(&artifact);
    let generation = m["wal"]["generation"].as_str().unwrap().to_owned();
    assert!(generation.starts_with("wal-gen:"), "{generation}");
    let (code, out, _) = cli(&[os("verify"), artifact.as_os_str()]);
    assert_eq!(code, 0, "{out}");
    m["wal"]["generation"] = generation.replace("frame-1:", "frame-1:f").into();
    fs::write(
        artifact.join("manifest.json"),
        serde_json::to_vec_pretty(&m).unwrap(),
    )
    .unwrap();
    let (code, out, _) = cli(&[os("verify"), artifact.as_os_str(), os("--json")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("holds the WAL generation"), "{out}");
}
