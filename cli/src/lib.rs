//! The library half of the `hermes-guard` command line: the benchmark workloads, shared by the
//! `hermes-guard bench` command (src/main.rs) and the criterion benches (benches/). Not a
//! published API.

pub mod workloads;
