//! SessionDb: sessions, messages and full-text search on a guarded database.
