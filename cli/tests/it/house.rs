//! The library's house rules, counted from its source by `tests/house.py` (docs/architecture.md,
//! "The house"): no circle between modules, at most three functions over 100 lines (each with
//! its reason written above it), `unsafe` blocks in at most twelve files.

use std::path::Path;
use std::process::Command;

#[test]
fn the_library_has_no_circle_few_long_functions_and_unsafe_in_few_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).arg("-V").output().is_ok())
        .expect("a python3 to run tests/house.py");
    let out = Command::new(python)
        .arg(root.join("tests/house.py"))
        .arg(root.join("src"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tests/house.py:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
