//! `cargo run -p hermes-guard-explore --example peek -- DB`: opens DB through the guard (as the
//! explorer's checks do) and prints its rows and the guard's status (debugging a replay).
use hermes_guard::GuardExt;
fn main() {
    let db = std::env::args().nth(1).expect("a database path");
    hermes_guard::register().unwrap();
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        &db,
        Default::default(),
        hermes_guard::VFS_NAME,
    )
    .unwrap();
    let mut stmt = conn.prepare("SELECT id, v FROM t").unwrap();
    let rows: Vec<(i64, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop(stmt);
    println!("rows {rows:?}");
    println!("status {:?}", conn.guard_status());
}
