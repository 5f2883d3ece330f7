//! A WAL frame written as one: its 24-byte header, held since SQLite wrote it
//! (`state/frames.rs`), and its page, in one write after one check.
//!
//! On the unix VFS: one `pwritev` on SQLite's own descriptor of the WAL, as `unixWrite` writes
//! (the same loop over short writes and `EINTR`, the same answers: `SQLITE_FULL` when the disk
//! is full or nothing could be written, `SQLITE_IOERR_WRITE` otherwise, the errno kept as the
//! file's last). No copy: the page is written from SQLite's buffer. Under another VFS the two
//! are copied into one buffer for its `xWrite`.

use std::ffi::c_int;
use std::io::IoSlice;
use std::os::fd::BorrowedFd;

use rusqlite::ffi;
use rustix::io::Errno;

use super::Io;
use crate::vfs::state::FRAME_HEADER;

/// Writes `header` at `at` and `page` right after it, as one write, on the live WAL file `io`,
/// inside SQLite's call of its `xWrite`.
pub(super) fn write_frame(
    io: Io<'_>,
    header: &[u8; FRAME_HEADER as usize],
    page: &[u8],
    at: i64,
) -> c_int {
    let Some(fd) = io.unix_fd() else {
        let mut frame = Vec::with_capacity(header.len() + page.len());
        frame.extend_from_slice(header);
        frame.extend_from_slice(page);
        return io.write(&frame, at);
    };
    let (code, errno) = match write_all(fd, header, page, at) {
        Ok(()) => return ffi::SQLITE_OK,
        Err(e) if e == Errno::NOSPC => (ffi::SQLITE_FULL, 0),
        Err(e) => (ffi::SQLITE_IOERR_WRITE, e.raw_os_error()),
    };
    io.set_last_errno(errno);
    code
}

/// `pwritev` until both are down. A write of nothing is the disk full, as `unixWrite` takes it.
fn write_all(fd: BorrowedFd<'_>, header: &[u8], page: &[u8], at: i64) -> Result<(), Errno> {
    let mut slices = [IoSlice::new(header), IoSlice::new(page)];
    let mut left = &mut slices[..];
    let mut offset = u64::try_from(at).map_err(|_| Errno::INVAL)?;
    while !left.is_empty() {
        match rustix::io::pwritev(fd, left, offset) {
            Ok(0) => return Err(Errno::NOSPC),
            Ok(n) => {
                offset += n as u64;
                IoSlice::advance_slices(&mut left, n);
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
