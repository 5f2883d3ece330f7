//! Empty: the package exists for its one test target, `loom_protocol` (src/vfs/loom_protocol.rs).
