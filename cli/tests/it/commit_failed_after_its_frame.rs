//! A commit whose files change after its commit frame is written and before the check after it
//! (`src/vfs/state/frames.rs`): the application is told the commit failed, so the guard keeps
//! its frames out of everything that reads the generation — the capture and the heal at close
//! (`src/capture/unacknowledged.rs`). The application's retry on a new connection is then the
//! row's only copy: after the runbook it is live exactly once.
//!
//! The moment is made with `strace`: attached to a guarded writer process (`hermes-guard writer`,
//! role gateway), it stops the writer with SIGSTOP as its commit frame's `pwritev` returns (the
//! guard writes a frame's header and page as one `pwritev`; a one-row commit is one frame). The
//! test removes `-wal` and `-shm` while it is stopped, then lets it go on.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    apply_every_listed_recovery, artifacts, count_like, insert, integrity_ok, is_refusal, manifest,
    open_guarded, open_stock, skip_unless_ci, Gateway, NewerGenerationOpen,
};

/// `strace`, attached to `pid`, stopping it (SIGSTOP) as its next `pwritev` returns.
struct StopAtNextFrame {
    strace: Child,
    pid: u32,
    /// What strace prints: the stop is certain once it says "stopped by SIGSTOP" (the group-stop
    /// after the write; the tracee's state alone shows a tracing stop at the call's entry too).
    log: std::path::PathBuf,
}

impl StopAtNextFrame {
    /// Attaches; the reason when `strace` cannot attach here.
    fn attach(pid: u32, log: &Path) -> Result<StopAtNextFrame, String> {
        let strace = Command::new("strace")
            .args(["-qq", "-e", "trace=pwritev"])
            .args(["-e", "inject=pwritev:signal=SIGSTOP:when=1", "-o"])
            .arg(log)
            .arg("-p")
            .arg(pid.to_string())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("strace could not be run: {e}"))?;
        let mut stop = StopAtNextFrame {
            strace,
            pid,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while stop.tracer().is_none() {
            if let Ok(Some(status)) = stop.strace.try_wait() {
                let mut why = String::new();
                if let Some(mut err) = stop.strace.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut why);
                }
                return Err(format!("strace could not attach ({status}): {why}"));
            }
            assert!(Instant::now() < deadline, "strace did not attach in 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(stop)
    }

    fn tracer(&self) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("TracerPid:"))?;
        line["TracerPid:".len()..]
            .trim()
            .parse()
            .ok()
            .filter(|&p| p != 0)
    }

    /// Waits until the writer is stopped after its frame's write.
    fn wait_stopped(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains("stopped by SIGSTOP")) {
            assert!(
                Instant::now() < deadline,
                "the writer never wrote its frame"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets the writer go on, and detaches (strace lets go of its tracee on SIGTERM).
    fn release(mut self) {
        let signal = |pid: u32, sig| {
            let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
            rustix::process::kill_process(pid, sig).unwrap();
        };
        signal(self.pid, rustix::process::Signal::CONT);
        signal(self.strace.id(), rustix::process::Signal::TERM);
        self.strace.wait().unwrap();
    }
}

/// A guarded writer with four rows in its WAL commits `ack 1`; its `-wal` and `-shm` are
/// removed after the commit frame is written and before the check after it. `before`: run once
/// the writer is ready (a peer opens). Returns the writer, told the commit failed; `None` when
/// `strace` cannot attach here.
fn failed_after_its_frame(path: &Path, before: impl FnOnce()) -> Option<Gateway> {
    let (mut writer, ready) = Gateway::start(path, "guard");
    before();
    let pid = ready["pid"].as_u64().unwrap() as u32;
    let log = path.with_file_name("strace.log");
    let stop = match StopAtNextFrame::attach(pid, &log) {
        Ok(stop) => stop,
        Err(why) => {
            skip_unless_ci(&why);
            writer.kill();
            return None;
        }
    };
    writer.send("ack 1");
    stop.wait_stopped();
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        std::fs::remove_file(side).unwrap();
    }
    stop.release();
    let ack = writer.next_event("ack");
    assert_eq!(ack["refused"], true, "the commit was acknowledged: {ack}");
    Some(writer)
}

/// The application's side after the failure: a new connection, the same row again.
fn retry(writer: &mut Gateway) {
    writer.send("reconnect");
    writer.next_event("reconnected");
    writer.send("ack 1");
    let ack = writer.next_event("ack");
    assert_eq!(ack["refused"], false, "the retry was refused: {ack}");
}

fn assert_kept_once(path: &Path, runbook: &str) {
    let conn = open_stock(path);
    assert_eq!(
        count_like(&conn, "ack 1"),
        1,
        "the failed commit's row\n{runbook}"
    );
    assert_eq!(
        count_like(&conn, "uncheckpointed %"),
        4,
        "the rows acknowledged before it\n{runbook}"
    );
    assert!(integrity_ok(&conn));
}

/// The writer closes its lost generation alone: the heal at close puts the generation back
/// into the live file, without the failed commit; its retry is the row's only copy.
#[test]
fn a_commit_failed_after_its_frame_is_not_healed_back_beside_its_retry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let Some(mut writer) = failed_after_its_frame(&path, || ()) else {
        return;
    };
    retry(&mut writer);
    assert!(writer.quit().success());
    let runbook = apply_every_listed_recovery(&path);
    assert_kept_once(&path, &runbook);
}

/// A newer generation is open at the path when the writer's lost generation closes (no heal):
/// the capture holds the four rows acknowledged before the failed commit and not the failed
/// commit itself, so the runbook does not bring it back beside its retry.
#[test]
fn a_commit_failed_after_its_frame_is_left_out_of_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let Some(mut writer) = failed_after_its_frame(&path, || ()) else {
        return;
    };
    let newer = NewerGenerationOpen::start(&path);
    retry(&mut writer);
    assert!(writer.quit().success());
    drop(newer);
    let captured = artifacts(dir.path());
    assert_eq!(captured.len(), 1, "{captured:?}");
    let wal = &manifest(&captured[0])["wal"];
    assert_eq!(
        wal["commits"], 4,
        "the four rows' commits, not the failed one: {wal}"
    );
    assert_eq!(wal["failed_commit"]["at"], wal["bytes"], "{wal}");
    let runbook = apply_every_listed_recovery(&path);
    assert_kept_once(&path, &runbook);
}

/// A guarded peer in another process (this one) shares the writer's generation. After the
/// writer's commit fails, the peer's own write is refused and it captures the generation: it
/// finds the writer's capture, which left the failed commit out, and takes it as its own (its
/// WAL holds the same bytes up to there and the failed commit's first write after them)
/// rather than capture the WAL whole, failed frames and all.
#[test]
fn a_peer_process_of_the_generation_leaves_the_failed_commit_out_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut peer = None;
    let Some(mut writer) = failed_after_its_frame(&path, || peer = Some(open_guarded(&path)))
    else {
        return;
    };
    let peer = peer.unwrap();
    let refused = insert(&peer, "the peer's row").unwrap_err();
    assert!(is_refusal(&refused), "{refused}");
    retry(&mut writer);
    drop(peer);
    assert!(writer.quit().success());
    assert_eq!(artifacts(dir.path()).len(), 1, "one capture, shared");
    let runbook = apply_every_listed_recovery(&path);
    assert_kept_once(&path, &runbook);
}
