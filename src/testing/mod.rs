//! Switches that exist only for this repository's own tests, apart from the library's rooms and
//! compiled only with a feature no application enables: the connection explorer's fault
//! switches (`explore-faults`, tests/explore) and the injected capture failures (`test-hooks`).
//! Each is off until a test turns it on. The library reads them only through [`seam`], which
//! every build has: the production functions carry no `cfg` branch of their own.

#[cfg(any(test, feature = "test-hooks"))]
pub(crate) mod capture_faults;
#[cfg(feature = "explore-faults")]
pub mod explore_faults;
pub(crate) mod seam;
