//! `manifest.json` as recovery reads it: its own types, tolerant of keys it does not need (the
//! Python implementation writes the same format).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A capture's `manifest.json` (version 1), as far as recovery needs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureManifest {
    /// Format version: 1.
    pub version: u32,
    /// The database's pathname, for display.
    pub database: String,
    /// The exact bytes of that pathname in hex, when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_hex: Option<String>,
    /// `halt` or `close`.
    #[serde(default)]
    pub trigger: Option<String>,
    /// `wal-lost`, `shm-lost` or `main-replaced`.
    #[serde(default)]
    pub reason: Option<String>,
    /// The capturing process.
    #[serde(default)]
    pub pid: Option<u32>,
    /// UTC, RFC 3339.
    #[serde(default)]
    pub captured_at: Option<String>,
    /// The captured WAL.
    pub wal: ManifestWal,
    /// The captured main image.
    pub main: ManifestMain,
    /// The loss left the live main file torn (see docs/recovery.md).
    #[serde(default)]
    pub main_torn: bool,
}

/// The WAL part of the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestWal {
    /// File name inside the capture.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// sha256, hex.
    pub sha256: String,
    /// Valid frames.
    #[serde(default)]
    pub frames: u64,
    /// Commit frames among them: transactions.
    #[serde(default)]
    pub commits: u64,
}

/// The main-image part of the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestMain {
    /// `[dev, ino]` of the main file the retired connection had open.
    #[serde(default)]
    pub identity: Option<[u64; 2]>,
    /// File name inside the capture.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// sha256, hex.
    pub sha256: String,
}

impl CaptureManifest {
    /// The database's exact pathname (from `database_hex` when present).
    pub fn database_path(&self) -> PathBuf {
        crate::paths::path_from_parts(self.database.clone(), self.database_hex.as_deref())
            .unwrap_or_else(|_| PathBuf::from(&self.database))
    }

    /// Whether the capture is of a replaced main file (a restore: an operator's decision).
    pub fn is_main_replaced(&self) -> bool {
        self.reason.as_deref() == Some("main-replaced")
    }
}

/// A file name from the manifest is used only as a plain name inside the capture.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}
