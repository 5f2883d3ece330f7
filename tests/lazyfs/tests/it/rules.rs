//! The power-loss filesystem's rules, each shown against a small program (this test) writing
//! through the mount: what is visible at once, what a power cut keeps.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use hermes_guard_lazyfs::{Crash, Data, LazyFs, Names};

struct Setup {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    images: PathBuf,
}

// Every test closes its files before the power cut: unmounting needs the mount unused.

/// A backing directory holding `files` (durable), and an empty mount point.
fn setup(files: &[(&str, &[u8])]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (backing, mnt, images) = (
        dir.path().join("backing"),
        dir.path().join("mnt"),
        dir.path().join("images"),
    );
    for d in [&backing, &mnt, &images] {
        fs::create_dir(d).unwrap();
    }
    for (name, bytes) in files {
        fs::write(backing.join(name), bytes).unwrap();
    }
    Setup {
        _dir: dir,
        backing,
        mnt,
        images,
    }
}

fn mount(s: &Setup, crash_before: Option<usize>) -> LazyFs {
    LazyFs::mount(&s.backing, &s.mnt, crash_before).expect("the power-loss filesystem must mount")
}

/// The image under `names`/`data`, written under a fresh directory.
fn image(s: &Setup, crash: &Crash, names: Names, data: Data) -> PathBuf {
    let dest = s.images.join(format!("{names:?}-{data:?}"));
    crash.write_image(&dest, names, data).unwrap();
    dest
}

fn dir_sync(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

#[test]
fn an_unsynced_write_is_visible_at_once_and_lost_at_a_power_cut() {
    let s = setup(&[("f", b"old")]);
    let lazy = mount(&s, None);
    fs::write(lazy.path().join("f"), b"new").unwrap();
    assert_eq!(fs::read(lazy.path().join("f")).unwrap(), b"new");
    let crash = lazy.power_cut().unwrap();
    for names in [Names::Strict, Names::Ordered] {
        assert_eq!(
            fs::read(image(&s, &crash, names, Data::Drop).join("f")).unwrap(),
            b"old"
        );
    }
}

#[test]
fn an_fsynced_write_survives_a_power_cut() {
    let s = setup(&[("f", b"old")]);
    let lazy = mount(&s, None);
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(lazy.path().join("f"))
        .unwrap();
    f.write_all(b"new").unwrap();
    f.sync_data().unwrap();
    drop(f);
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b"new"
    );
}

#[test]
fn a_creation_is_durable_only_after_its_directory_is_fsynced() {
    let s = setup(&[]);
    let lazy = mount(&s, None);
    let mut f = File::create(lazy.path().join("synced-data")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let crash = lazy.power_cut().unwrap();
    assert!(!image(&s, &crash, Names::Strict, Data::Drop)
        .join("synced-data")
        .exists());
    // Journaled metadata keeps the name (and the data its fsync saw).
    assert_eq!(
        fs::read(image(&s, &crash, Names::Ordered, Data::Drop).join("synced-data")).unwrap(),
        b"data"
    );
}

#[test]
fn a_file_whose_name_was_synced_but_not_its_data_comes_back_empty() {
    let s = setup(&[]);
    let lazy = mount(&s, None);
    fs::write(lazy.path().join("f"), b"never fsynced").unwrap();
    dir_sync(lazy.path());
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b""
    );
}

#[test]
fn an_unsynced_rename_is_undone_and_a_synced_one_kept() {
    let s = setup(&[("a", b"1"), ("b", b"2")]);
    let lazy = mount(&s, None);
    fs::rename(lazy.path().join("a"), lazy.path().join("a2")).unwrap();
    let crash = lazy.power_cut().unwrap();
    let img = image(&s, &crash, Names::Strict, Data::Drop);
    assert!(img.join("a").exists() && !img.join("a2").exists());

    let lazy = mount(&s, None);
    fs::rename(lazy.path().join("b"), lazy.path().join("b2")).unwrap();
    dir_sync(lazy.path());
    let crash = lazy.power_cut().unwrap();
    let img = s.images.join("second");
    crash.write_image(&img, Names::Strict, Data::Drop).unwrap();
    assert!(!img.join("b").exists());
    assert_eq!(fs::read(img.join("b2")).unwrap(), b"2");
}

#[test]
fn under_journaled_metadata_a_rename_survives_while_its_unsynced_data_does_not() {
    let s = setup(&[("target", b"old")]);
    let lazy = mount(&s, None);
    fs::write(lazy.path().join("tmp"), b"new").unwrap();
    fs::rename(lazy.path().join("tmp"), lazy.path().join("target")).unwrap();
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Ordered, Data::Drop).join("target")).unwrap(),
        b""
    );
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("target")).unwrap(),
        b"old"
    );
}

#[test]
fn an_unsynced_unlink_is_undone() {
    let s = setup(&[("f", b"kept")]);
    let lazy = mount(&s, None);
    fs::remove_file(lazy.path().join("f")).unwrap();
    assert!(!lazy.path().join("f").exists());
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b"kept"
    );
    assert!(!image(&s, &crash, Names::Ordered, Data::Drop)
        .join("f")
        .exists());
}

#[test]
fn an_unsynced_multi_page_write_is_torn_at_page_granularity() {
    let page = hermes_guard_lazyfs::crash::PAGE;
    let s = setup(&[("f", &vec![0u8; 4 * page])]);
    let lazy = mount(&s, None);
    let f = OpenOptions::new()
        .write(true)
        .open(lazy.path().join("f"))
        .unwrap();
    f.write_all_at(&vec![9u8; 4 * page], 0).unwrap();
    drop(f);
    let crash = lazy.power_cut().unwrap();
    let torn = fs::read(image(&s, &crash, Names::Strict, Data::Torn).join("f")).unwrap();
    let pages: Vec<u8> = torn.chunks(page).map(|p| p[0]).collect();
    assert_eq!(pages, [9, 0, 9, 0]);
}

#[test]
fn at_an_armed_step_the_filesystem_freezes_without_performing_it() {
    let s = setup(&[]);
    let lazy = mount(&s, Some(2));
    let mut f = File::create(lazy.path().join("f")).unwrap(); // step 1: create
    f.write_all(b"data").unwrap();
    let err = f.sync_all().unwrap_err(); // step 2: fsync, the crash point
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(lazy.frozen());
    assert!(fs::read(lazy.path().join("f")).is_err());
    assert_eq!(lazy.steps(), ["create f"]);
    drop(f);
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Ordered, Data::Drop).join("f")).unwrap(),
        b""
    );
}

#[test]
fn the_durable_steps_are_enumerated_in_order() {
    let s = setup(&[]);
    let lazy = mount(&s, None);
    fs::create_dir(lazy.path().join("d")).unwrap();
    let mut f = File::create(lazy.path().join("d/x")).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_data().unwrap();
    fs::rename(lazy.path().join("d/x"), lazy.path().join("y")).unwrap();
    dir_sync(lazy.path());
    fs::remove_file(lazy.path().join("y")).unwrap();
    drop(f);
    assert_eq!(
        lazy.steps(),
        [
            "mkdir d",
            "create d/x",
            "fdatasync d/x",
            "rename d/x -> y",
            "fsyncdir .",
            "unlink y"
        ]
    );
}

#[test]
fn restored_in_place_an_undone_unlink_brings_back_the_same_inode() {
    use std::os::unix::fs::MetadataExt;
    let s = setup(&[("f", b"kept")]);
    let inode = fs::metadata(s.backing.join("f")).unwrap().ino();
    let lazy = mount(&s, None);
    fs::remove_file(lazy.path().join("f")).unwrap();
    let crash = lazy.power_cut().unwrap();
    crash.restore(Names::Strict, Data::Drop).unwrap();
    let meta = fs::metadata(s.backing.join("f")).unwrap();
    assert_eq!(meta.ino(), inode);
    assert_eq!(fs::read(s.backing.join("f")).unwrap(), b"kept");
}

#[test]
fn restored_in_place_the_backing_directory_holds_only_what_is_durable() {
    let s = setup(&[("f", b"unlinked"), ("g", b"old")]);
    let lazy = mount(&s, None);
    fs::remove_file(lazy.path().join("f")).unwrap();
    fs::remove_file(lazy.path().join("g")).unwrap();
    dir_sync(lazy.path());
    fs::write(lazy.path().join("g"), b"new, name never synced").unwrap();
    let crash = lazy.power_cut().unwrap();
    crash.restore(Names::Strict, Data::Drop).unwrap();
    let left: Vec<_> = fs::read_dir(&s.backing)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_power_cut_while_a_file_is_open_fails_and_leaves_no_mount_behind() {
    let s = setup(&[("f", b"x")]);
    let lazy = mount(&s, None);
    let open = File::open(lazy.path().join("f")).unwrap();
    let err = lazy.power_cut().unwrap_err();
    assert!(err.to_string().contains("detached lazily (done)"), "{err}");
    drop(open);
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(s.mnt.to_str().unwrap()), "{mounts}");
}

/// A process forked by another thread holds every descriptor open at the fork until its exec:
/// a file the test has closed can keep the mount busy for a moment. The cut waits that out
/// rather than failing (CI once failed here on EBUSY).
#[test]
fn a_power_cut_waits_for_a_file_another_process_holds_for_a_moment() {
    let s = setup(&[("f", b"x")]);
    let lazy = mount(&s, None);
    let open = File::open(lazy.path().join("f")).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("0.3")
        .stdin(open)
        .spawn()
        .unwrap();
    let crash = lazy.power_cut();
    child.wait().unwrap();
    let crash = crash.unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b"x"
    );
}

/// A bug the model once had: a file with two names dropped out of tracking when one was unlinked,
/// and the cut brought it back as a new, empty inode without its extended attributes.
#[test]
fn a_file_unlinked_from_one_of_two_names_survives_the_cut_as_the_same_inode_with_its_xattrs() {
    use std::os::unix::fs::MetadataExt;
    let s = setup(&[("f", b"kept")]);
    let flags = rustix::fs::XattrFlags::empty();
    rustix::fs::setxattr(s.backing.join("f"), "user.base", b"record", flags).unwrap();
    let inode = fs::metadata(s.backing.join("f")).unwrap().ino();
    let lazy = mount(&s, None);
    fs::create_dir(lazy.path().join("d")).unwrap();
    fs::hard_link(lazy.path().join("f"), lazy.path().join("d/g")).unwrap();
    dir_sync(&lazy.path().join("d"));
    dir_sync(lazy.path());
    // Looked up through the new name (the lookup once re-pointed the file's only path there).
    assert_eq!(fs::read(lazy.path().join("d/g")).unwrap(), b"kept");
    fs::remove_file(lazy.path().join("d/g")).unwrap();
    let crash = lazy.power_cut().unwrap();
    crash.restore(Names::Strict, Data::Drop).unwrap();
    for name in ["f", "d/g"] {
        let path = s.backing.join(name);
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode, "{name}");
        assert_eq!(fs::read(&path).unwrap(), b"kept", "{name}");
        let mut value = [0u8; 16];
        let n = rustix::fs::getxattr(&path, "user.base", &mut value).unwrap();
        assert_eq!(&value[..n], b"record", "{name}");
    }
}

#[test]
fn an_xattr_is_durable_only_after_the_files_fsync() {
    let s = setup(&[("f", b"x"), ("g", b"y")]);
    let lazy = mount(&s, None);
    let flags = rustix::fs::XattrFlags::empty();
    for name in ["f", "g"] {
        rustix::fs::setxattr(lazy.path().join(name), "user.r", name.as_bytes(), flags).unwrap();
    }
    File::open(lazy.path().join("g"))
        .unwrap()
        .sync_all()
        .unwrap();
    let crash = lazy.power_cut().unwrap();
    crash.restore(Names::Strict, Data::Drop).unwrap();
    let mut value = [0u8; 16];
    assert!(rustix::fs::getxattr(s.backing.join("f"), "user.r", &mut value).is_err());
    let n = rustix::fs::getxattr(s.backing.join("g"), "user.r", &mut value).unwrap();
    assert_eq!(&value[..n], b"g");
}

#[test]
fn a_reordered_state_keeps_some_unsynced_name_operations_and_not_others() {
    let s = setup(&[("a", b"1"), ("b", b"2")]);
    let lazy = mount(&s, None);
    fs::rename(lazy.path().join("a"), lazy.path().join("a2")).unwrap();
    fs::remove_file(lazy.path().join("b")).unwrap();
    let crash = lazy.power_cut().unwrap();
    let steps: Vec<usize> = crash.pending().iter().map(|op| op.step).collect();
    assert_eq!(steps, [0, 1]);
    // The unlink kept, the rename (one operation: both of its names) not.
    crash.restore_with(&[false, true], Data::Drop).unwrap();
    assert_eq!(fs::read(s.backing.join("a")).unwrap(), b"1");
    assert!(!s.backing.join("a2").exists() && !s.backing.join("b").exists());
}

#[test]
fn a_failed_fsync_keeps_its_pages_off_the_disk_even_after_a_later_fsync_succeeds() {
    let s = setup(&[("f", b"old")]);
    let fault = Some(hermes_guard_lazyfs::Fault::SyncFails(1));
    let lazy = LazyFs::mount_with(&s.backing, &s.mnt, fault).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(lazy.path().join("f"))
        .unwrap();
    f.write_all_at(b"new", 0).unwrap();
    assert!(f.sync_data().is_err(), "the first fsync fails with EIO");
    f.sync_data().unwrap(); // the retry succeeds, and writes nothing of the failed pages
    drop(f);
    assert_eq!(fs::read(lazy.path().join("f")).unwrap(), b"new");
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b"old"
    );
}

#[test]
fn a_chosen_write_to_a_created_file_fails_with_enospc() {
    let s = setup(&[]);
    let fault = Some(hermes_guard_lazyfs::Fault::WriteFull(2));
    let lazy = LazyFs::mount_with(&s.backing, &s.mnt, fault).unwrap();
    let f = File::create(lazy.path().join("f")).unwrap();
    f.write_all_at(b"first", 0).unwrap();
    let err = f.write_all_at(b"second", 5).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    drop(f);
    assert_eq!(fs::read(lazy.path().join("f")).unwrap(), b"first");
}

#[test]
fn rebooted_under_the_same_mount_a_surviving_file_keeps_its_device_and_inode() {
    use std::os::unix::fs::MetadataExt;
    let s = setup(&[("f", b"kept")]);
    let lazy = mount(&s, None);
    let before = fs::metadata(lazy.path().join("f")).unwrap();
    fs::remove_file(lazy.path().join("f")).unwrap();
    fs::write(lazy.path().join("g"), b"never synced").unwrap();
    lazy.reboot(Names::Strict, Data::Drop).unwrap();
    let after = fs::metadata(lazy.path().join("f")).unwrap();
    assert_eq!((after.dev(), after.ino()), (before.dev(), before.ino()));
    assert_eq!(fs::read(lazy.path().join("f")).unwrap(), b"kept");
    assert!(!lazy.path().join("g").exists());
    // Everything there is durable now: a second cut keeps it.
    let crash = lazy.power_cut().unwrap();
    assert_eq!(
        fs::read(image(&s, &crash, Names::Strict, Data::Drop).join("f")).unwrap(),
        b"kept"
    );
}
