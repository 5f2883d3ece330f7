//! The shared registry of open SessionDb generations.
