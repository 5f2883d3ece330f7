//! sha256 over a stream: the one read-hash loop the capture, recovery, the stale-WAL check and the
//! CLI share.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

/// Bytes read per step.
const CHUNK: usize = 1 << 20;

/// Reads `reader` to its end in 1 MiB chunks, hashing each chunk and handing it to `each` (a
/// copy, a WAL scanner) before the next read. Returns the lowercase hex sha256 and the number of
/// bytes. A read error becomes `E` through `read_failed`; `each`'s error is returned as it is.
pub fn sha256_stream_with<E>(
    mut reader: impl Read,
    read_failed: impl FnOnce(io::Error) -> E,
    mut each: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(String, u64), E> {
    let mut buf = vec![0u8; CHUNK];
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_failed(e)),
        };
        hash.update(&buf[..n]);
        each(&buf[..n])?;
        bytes += n as u64;
    }
    Ok((crate::paths::hex(&hash.finalize()), bytes))
}

/// [`sha256_stream_with`] for I/O errors on both sides.
pub fn sha256_stream(
    reader: impl Read,
    each: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<(String, u64)> {
    sha256_stream_with(reader, |e| e, each)
}

/// A reader that hashes and counts what passes through it, for a consumer that pulls (recovery's
/// `verify` reads the WAL frame by frame through it).
pub(crate) struct Hashing<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let read = buf.get(..n).unwrap_or(&[]);
        self.hash.update(read);
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R> Hashing<R> {
    pub(crate) fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            bytes: 0,
        }
    }

    /// The lowercase hex sha256 of what was read, and how many bytes.
    pub(crate) fn finish(self) -> (String, u64) {
        (crate::paths::hex(&self.hash.finalize()), self.bytes)
    }
}

/// A reader over `file` from `pos` by positioned reads (`pread`): the descriptor's own offset,
/// which SQLite may be using, is left alone.
pub(crate) struct ReadAt<'a> {
    pub(crate) file: &'a File,
    pub(crate) pos: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_counts_every_byte_and_hands_each_on() {
        let data = vec![7u8; CHUNK + 3];
        let mut seen = Vec::new();
        let (hex, n) = sha256_stream(&data[..], |c| {
            seen.extend_from_slice(c);
            Ok(())
        })
        .unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(seen, data);
        assert_eq!(hex, crate::paths::hex(&Sha256::digest(&data)));
    }
}
