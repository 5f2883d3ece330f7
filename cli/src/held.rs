//! `hermes-guard held`: which processes hold retired WAL generations open, and how many
//! descriptors for them — the question an operator has when a status says `held_generations`
//! and asks which process to restart, or where the disk space of a deleted WAL went.
//!
//! A retired generation that is held (its capture not written yet, or written but its
//! connection still open) keeps its unlinked `-wal` open: `/proc/<pid>/fd` shows it as
//! `<path>-wal (deleted)`. This lists every such descriptor of every process this user can see,
//! and says of each whether its bytes are captured: a capture of the database (beside it or in a
//! fallback capture directory) whose manifest records that WAL's inode and at least its current
//! size. Captured: nothing to do (the descriptor goes when its connection closes). Not captured
//! (a guarded process whose capture failed, or a stock process): the bytes exist only in that
//! process — copy them from `/proc/<pid>/fd/<n>` before restarting it.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;

/// `held --help`'s exit codes.
pub const HELD_EXIT_CODES: &str = "\
Exit codes:
  0  listed (no process holding a deleted -wal is 0 too)
  2  bad input: a usage error, or an --under path that does not exist
Processes of other users are not visible without their permissions.

Runbook: hermes-guard help recovery";

#[derive(clap::Args)]
pub struct HeldArgs {
    /// Only descriptors of WALs under this directory (default: every one).
    #[arg(long)]
    under: Option<PathBuf>,
    /// One JSON document.
    #[arg(long)]
    json: bool,
}

/// One process's held retired WALs.
struct Holder {
    command: String,
    /// The WAL's former path, with how many descriptors of it the process holds and the first
    /// one's `/proc/<pid>/fd/<n>` (the bytes can be copied from there while the process lives).
    wals: BTreeMap<PathBuf, (usize, PathBuf)>,
}

/// The capture that holds every byte of the deleted WAL open at `fd` (`/proc/<pid>/fd/<n>`),
/// once the WAL at `wal`, if any: its manifest records the WAL's inode and at least its size now.
fn captured_in(wal: &Path, fd: &Path) -> Option<PathBuf> {
    let held = std::fs::metadata(fd).ok()?;
    let db = PathBuf::from(OsStr::from_bytes(
        wal.as_os_str().as_bytes().strip_suffix(b"-wal")?,
    ));
    let listed = hermes_guard::recover::list_captures(&db).ok()?;
    listed.into_iter().find_map(|entry| {
        let m = entry.manifest.as_ref()?;
        let same = m.wal.identity.dev == held.dev() && m.wal.identity.ino == held.ino();
        (same && m.wal.bytes >= held.len()).then_some(entry.path)
    })
}

/// What to do about one held WAL, in words.
pub fn verdict(captured: Option<&Path>, fd: &Path) -> String {
    match captured {
        Some(capture) => format!(
            "captured in {}: nothing to do (the descriptor goes when its connection closes)",
            capture.display()
        ),
        None => format!(
            "NOT captured: its rows exist only in this process; copy {} before restarting it (a \
             guarded process retries its capture on its own; its status says why it failed)",
            fd.display()
        ),
    }
}

/// `<path>-wal (deleted)` → `<path>-wal`.
fn deleted_wal(target: &Path) -> Option<PathBuf> {
    let bytes = target.as_os_str().as_bytes();
    let name = bytes.strip_suffix(b" (deleted)")?;
    name.ends_with(b"-wal")
        .then(|| PathBuf::from(OsStr::from_bytes(name)))
}

/// One process's descriptors of the deleted `-wal` of one database, for `status`.
pub struct HeldWal {
    pub pid: u32,
    pub command: String,
    pub descriptors: usize,
    /// `/proc/<pid>/fd/<n>`: where its bytes can be copied from while the process lives.
    pub copy_from: PathBuf,
    /// The capture that holds its bytes, if one does.
    pub captured_in: Option<PathBuf>,
}

/// The processes holding `wal` (a database's `-wal`, by the path it had) open, deleted.
pub fn held_wal(wal: &Path) -> Vec<HeldWal> {
    holders(Some(wal))
        .into_iter()
        .flat_map(|(pid, h)| {
            h.wals.into_iter().filter(|(w, _)| w == wal).map(
                move |(w, (descriptors, copy_from))| HeldWal {
                    pid,
                    command: h.command.clone(),
                    descriptors,
                    captured_in: captured_in(&w, &copy_from),
                    copy_from,
                },
            )
        })
        .collect()
}

fn holders(under: Option<&Path>) -> BTreeMap<u32, Holder> {
    let mut found = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let mut wals = BTreeMap::new();
        for fd in fds.flatten() {
            let Some(wal) = std::fs::read_link(fd.path())
                .ok()
                .and_then(|t| deleted_wal(&t))
            else {
                continue;
            };
            if under.is_some_and(|dir| !wal.starts_with(dir)) {
                continue;
            }
            wals.entry(wal).or_insert((0, fd.path())).0 += 1;
        }
        if !wals.is_empty() {
            let command = std::fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default();
            found.insert(pid, Holder { command, wals });
        }
    }
    found
}

pub fn held(args: HeldArgs) -> ExitCode {
    if let Some(under) = &args.under {
        if let Err(e) = std::fs::metadata(under) {
            let message = format!("--under {}: {e}", under.display());
            if args.json {
                println!(
                    "{}",
                    json!({"ok": false, "error": message, "bad_input": true, "exit_code": 2})
                );
            }
            eprintln!("hermes-guard: {message}");
            return ExitCode::from(crate::recover_cmd::BAD_INPUT);
        }
    }
    let found = holders(args.under.as_deref());
    let descriptors: usize = found
        .values()
        .flat_map(|h| h.wals.values().map(|(n, _)| n))
        .sum();
    let captured: BTreeMap<(u32, &Path), Option<PathBuf>> = found
        .iter()
        .flat_map(|(pid, h)| {
            h.wals
                .iter()
                .map(move |(wal, (_, fd))| ((*pid, wal.as_path()), captured_in(wal, fd)))
        })
        .collect();
    let uncaptured = captured.values().filter(|c| c.is_none()).count();
    if args.json {
        let processes: Vec<_> = found
            .iter()
            .map(|(pid, h)| {
                json!({
                    "pid": pid,
                    "command": h.command,
                    "wals": h.wals.iter().map(|(wal, (n, fd))| {
                        let mut row = json!({"descriptors": n});
                        crate::recover_cmd::put_path(&mut row, "wal", wal);
                        crate::recover_cmd::put_path(&mut row, "copy_from", fd);
                        match &captured[&(*pid, wal.as_path())] {
                            Some(c) => {
                                row["captured"] = true.into();
                                crate::recover_cmd::put_path(&mut row, "capture", c);
                            }
                            None => row["captured"] = false.into(),
                        }
                        row
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({"processes": processes, "descriptors": descriptors,
                         "uncaptured": uncaptured});
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if found.is_empty() {
        println!("no process holds a deleted -wal open");
        return ExitCode::SUCCESS;
    }
    for (pid, h) in &found {
        for (wal, (n, fd)) in &h.wals {
            println!(
                "pid {pid:<8} {:<16} {n} descriptor(s) of {} (deleted): {}",
                h.command,
                wal.display(),
                verdict(captured[&(*pid, wal.as_path())].as_deref(), fd)
            );
        }
    }
    println!(
        "{} process(es), {descriptors} descriptor(s) of deleted WALs, {uncaptured} of them not \
         captured{}",
        found.len(),
        if uncaptured > 0 {
            ": restarting a process listed NOT captured loses those rows unless they are copied \
             first (hermes-guard help recovery)"
        } else {
            ": nothing to do"
        }
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_wal_link_names_the_wal_and_nothing_else_does() {
        assert_eq!(
            deleted_wal(Path::new("/srv/state.db-wal (deleted)")),
            Some(PathBuf::from("/srv/state.db-wal"))
        );
        assert_eq!(deleted_wal(Path::new("/srv/state.db-wal")), None);
        assert_eq!(deleted_wal(Path::new("/srv/state.db (deleted)")), None);
    }
}
