//! Why a heal at close did not happen, or stopped (`state/healing.rs`): each says what it
//! found, with the file involved; the heal's INFO line names the database.

use std::io;
use std::path::PathBuf;

use crate::identity::FileId;

#[derive(Debug, thiserror::Error)]
pub(super) enum HealError {
    #[error("this connection wrote the main file after its last full check")]
    MainWrittenHere,
    #[error("the main file was never stamped by a full check")]
    NeverStamped,
    #[error("stat: {source}")]
    StatMain { path: PathBuf, source: io::Error },
    #[error("the main file changed since the loss (or was replaced)")]
    MainChanged { path: PathBuf },
    #[error("stat of the -wal: {source}")]
    StatWal { path: PathBuf, source: io::Error },
    #[error(
        "a -wal this connection did not write is at the path (inode {}, the retired one was {}): \
         a newer generation",
        found.ino,
        retired.map_or_else(|| "unknown".into(), |w| w.ino.to_string())
    )]
    NewerWal {
        path: PathBuf,
        found: FileId,
        retired: Option<FileId>,
    },
    #[error("stat of the -shm: {source}")]
    StatShm { path: PathBuf, source: io::Error },
    #[error(
        "a -shm this connection did not map is at {} (inode {}): a newer generation",
        path.display(),
        found.ino
    )]
    NewerShm { path: PathBuf, found: FileId },
    #[error("SHARED on the main file was refused")]
    SharedRefused,
    #[error("another connection has the database open (EXCLUSIVE was refused)")]
    ExclusiveRefused,
    #[error("no pinned WAL")]
    NoPinnedWal,
    #[error("reading the pinned WAL: {source}")]
    ReadWal { wal: FileId, source: io::Error },
    #[error("the retired WAL holds no committed frame")]
    NoCommittedFrame { wal: FileId },
    #[error("no descriptor of the database's directory")]
    NoDirectory { database: PathBuf },
    #[error("the WAL path has no file name")]
    NoWalName { path: PathBuf },
    #[error("opening the capture {}: {source}", capture.display())]
    OpenCapture { capture: PathBuf, source: io::Error },
    #[error("writing the retired WAL's committed prefix beside the database: {source}")]
    Stage { wal: FileId, source: io::Error },
    #[error("recording the heal's start in {}: {source}", capture.display())]
    RecordStart { capture: PathBuf, source: io::Error },
    #[error("putting the retired WAL back at the path: {source}")]
    PutBack { staged: FileId, source: io::Error },
    #[error("reading the pinned WAL at {at}: {source} (the WAL is back in place)")]
    ReadFrame {
        wal: FileId,
        at: u64,
        source: io::Error,
    },
    #[error(
        "writing page {page} of the main file: SQLite code {rc} (the WAL is back in place: the \
         next open replays it)"
    )]
    WritePage { page: u32, rc: i32 },
    #[error(
        "truncating or syncing the main file: SQLite code {rc} (the WAL is back in place: the \
         next open replays it)"
    )]
    TruncateOrSync { rc: i32 },
}
