//! Switches that exist only for this repository's own tests, apart from the library's rooms and
//! compiled only with a feature no application enables: the connection explorer's fault
//! switches (`explore-faults`, tests/explore). Each is off until a test turns it on.

pub mod explore_faults;
