//! `hermes-guard held`: which processes hold retired WAL generations open, and how many
//! descriptors for them — the question an operator has when a status says `held_generations`
//! and asks which process to restart, or where the disk space of a deleted WAL went.
//!
//! A retired generation that is held (its capture not written yet, or written but its
//! connection still open) keeps its unlinked `-wal` open: `/proc/<pid>/fd` shows it as
//! `<path>-wal (deleted)`. This lists every such descriptor of every process this user can see.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;

/// `held --help`'s exit codes.
pub const HELD_EXIT_CODES: &str = "\
Exit codes:
  0  listed (no process holding a deleted -wal is 0 too)
  2  a usage error
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

/// `<path>-wal (deleted)` → `<path>-wal`.
fn deleted_wal(target: &Path) -> Option<PathBuf> {
    let bytes = target.as_os_str().as_bytes();
    let name = bytes.strip_suffix(b" (deleted)")?;
    name.ends_with(b"-wal")
        .then(|| PathBuf::from(OsStr::from_bytes(name)))
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
    let found = holders(args.under.as_deref());
    let descriptors: usize = found
        .values()
        .flat_map(|h| h.wals.values().map(|(n, _)| n))
        .sum();
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
                        row
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({"processes": processes, "descriptors": descriptors});
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
                "pid {pid:<8} {:<16} {n} descriptor(s) of {} (deleted); its bytes, while the \
                 process lives: {}",
                h.command,
                wal.display(),
                fd.display()
            );
        }
    }
    println!(
        "{} process(es), {descriptors} descriptor(s) of deleted WALs: a guarded process holds a \
         retired generation until it is captured (see its status: held_generations) and its \
         connection closes; restarting the process releases them (capture first: \
         hermes-guard help recovery)",
        found.len()
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
