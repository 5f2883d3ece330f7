//! The power-loss filesystem's tests, one binary (linked once): its own rules, then the crash
//! points of every write path, a module each. tests/crash-points.sh runs them.

mod crash_point_guard;
mod crash_point_let_go;
mod crash_point_rebuild;
mod crash_point_sqlite;
mod crash_point_store;
mod rules;
