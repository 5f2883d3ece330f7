//! A database path given on the command line, judged the same way by every command that takes
//! one (`status <db>`, `captures <db>`, `recover --into <db>` and `--main <file>`): a path with
//! nothing at it, a directory where a file is wanted, something that is not a regular file, or
//! a file that is not a SQLite database is bad input (exit 2), said in the same words by each.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Why a path given as a database cannot be used as one.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseArgError {
    /// Nothing is at the path.
    #[error("no database at {}: {}", path.display(), missing_words(path))]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A symbolic link whose target does not exist.
    #[error(
        "no database at {}: it is a symbolic link to {}, which does not exist",
        path.display(),
        target.display()
    )]
    DanglingLink {
        /// The path given.
        path: PathBuf,
        /// Where the link points.
        target: PathBuf,
    },
    /// A directory where a database file is wanted.
    #[error("{} is a directory, not a database file", path.display())]
    Directory {
        /// The path given.
        path: PathBuf,
    },
    /// A device, a FIFO or a socket: never opened, so never waited on.
    #[error("{} is not a database file (not a regular file)", path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
    },
    /// A file that does not begin with SQLite's header (and is not empty).
    #[error("{} is not a SQLite database file", path.display())]
    NotSqlite {
        /// The path given.
        path: PathBuf,
    },
    /// Something is at the path, but it cannot be looked at or read.
    #[error("{} cannot be read: {}", path.display(), io_words(source))]
    Unreadable {
        /// The path given.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

/// "it does not exist", and which of its directories does not either, when one does not.
fn missing_words(path: &Path) -> String {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    match parent.filter(|p| p.symlink_metadata().is_err()) {
        Some(dir) => format!(
            "it does not exist, nor does its directory {}",
            dir.display()
        ),
        None => "it does not exist".to_owned(),
    }
}

/// What the operating system said, with the one case a person meets most in their words.
fn io_words(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::PermissionDenied {
        format!("permission denied for this user ({e})")
    } else {
        e.to_string()
    }
}

/// What a command accepts at the path.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// A database file only.
    File,
    /// A database file, or a directory (`captures`: every capture in it).
    FileOrDirectory,
}

/// Checks that `path` is a database file (an empty file counts: SQLite reads it as an empty
/// database), or with [`Accept::FileOrDirectory`] a directory. Reads at most the file's first 16
/// bytes; opens nothing but a regular file.
pub fn check(path: &Path, accept: Accept) -> Result<(), DatabaseArgError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let path = path.to_path_buf();
            return Err(match std::fs::read_link(&path) {
                Ok(target) => DatabaseArgError::DanglingLink { path, target },
                Err(_) => DatabaseArgError::Missing { path },
            });
        }
        Err(source) => {
            return Err(DatabaseArgError::Unreadable {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if meta.is_dir() {
        return match accept {
            Accept::FileOrDirectory => Ok(()),
            Accept::File => Err(DatabaseArgError::Directory {
                path: path.to_path_buf(),
            }),
        };
    }
    if !meta.is_file() {
        return Err(DatabaseArgError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut head = Vec::with_capacity(16);
    std::fs::File::open(path)
        .and_then(|f| f.take(16).read_to_end(&mut head))
        .map_err(|source| DatabaseArgError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
    if head.is_empty() || head == b"SQLite format 3\0" {
        Ok(())
    } else {
        Err(DatabaseArgError::NotSqlite {
            path: path.to_path_buf(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_path_is_judged_in_its_own_words() {
        let dir = tempfile::tempdir().unwrap();
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, b"hello\n").unwrap();
        let empty = dir.path().join("empty.db");
        std::fs::write(&empty, b"").unwrap();
        let missing = dir.path().join("state.db");
        let deeper = dir.path().join("nowhere").join("state.db");
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&missing, &link).unwrap();

        let said = |p: &Path, a| check(p, a).unwrap_err().to_string();
        assert!(check(&empty, Accept::File).is_ok());
        assert!(check(dir.path(), Accept::FileOrDirectory).is_ok());
        assert_eq!(
            said(&notes, Accept::FileOrDirectory),
            format!("{} is not a SQLite database file", notes.display())
        );
        assert_eq!(
            said(&missing, Accept::File),
            format!("no database at {}: it does not exist", missing.display())
        );
        assert!(said(&deeper, Accept::File).ends_with(&format!(
            "nor does its directory {}",
            dir.path().join("nowhere").display()
        )));
        assert!(said(&link, Accept::File).contains("a symbolic link to"));
        assert!(said(dir.path(), Accept::File).ends_with("is a directory, not a database file"));
        assert!(said(Path::new("/dev/null"), Accept::File).contains("not a regular file"));
    }
}
