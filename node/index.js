// hermes-guard for Node: the loadable extension (native/libhermes_guard.so) and the command
// (native/hermes-guard) this package carries, and the few lines that load the extension into
// better-sqlite3. better-sqlite3 compiles SQLite without URI filenames (`?vfs=` is ignored) and
// loads extensions only through an open connection, so `enable` loads it once through a
// throwaway in-memory connection with the entry point that makes the guard SQLite's default VFS
// for the whole process: every Database opened afterwards is guarded.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

/** The loadable extension's absolute path (for other hosts: the sqlite3 shell's `.load`). */
const extensionPath = path.join(__dirname, 'native', 'libhermes_guard.so');
/** The `hermes-guard` command's absolute path (captures, verify, recover, status, held). */
const cliPath = path.join(__dirname, 'native', 'hermes-guard');
/** The entry point that registers the guard and makes it the default VFS. */
const DEFAULT_ENTRY_POINT = 'sqlite3_hermesguard_default_init';
/** The entry point that registers the guard beside the default VFS (`?vfs=hermes-guard`). */
const ENTRY_POINT = 'sqlite3_hermesguard_init';

const enabled = new WeakSet();

function checkPlatform() {
  if (process.platform !== 'linux') {
    throw new Error(
      `hermes-guard runs on Linux only (the guard relies on inotify, /proc and open-file-description locks); this is ${process.platform}`,
    );
  }
  if (!fs.existsSync(extensionPath)) {
    throw new Error(`hermes-guard: the package has no ${extensionPath}: it was packed without its native files`);
  }
}

/**
 * Makes hermes-guard the default VFS of the SQLite library `Database` (better-sqlite3's class)
 * runs on: every `new Database(file)` after this call is guarded. Idempotent; call it once at
 * start-up, before opening the databases to guard. Throws what better-sqlite3 throws when the
 * extension cannot be loaded.
 */
function enable(Database) {
  checkPlatform();
  if (typeof Database !== 'function') {
    throw new TypeError("hermes-guard: enable(Database) takes better-sqlite3's Database class: enable(require('better-sqlite3'))");
  }
  if (enabled.has(Database)) return;
  const boot = new Database(':memory:');
  try {
    boot.loadExtension(extensionPath, DEFAULT_ENTRY_POINT);
  } finally {
    boot.close();
  }
  enabled.add(Database);
}

/** The guard's status of `db`'s main database (after its retirement check), as an object. */
function status(db) {
  return JSON.parse(db.prepare('SELECT hermes_guard_status() AS status').pluck().get());
}

/** Whether `error` is the guard's refusal of a write into a retired generation (1032). */
function isRetired(error) {
  return Boolean(error) && error.code === 'SQLITE_READONLY_DBMOVED';
}

module.exports = { enable, status, isRetired, extensionPath, cliPath, ENTRY_POINT, DEFAULT_ENTRY_POINT };
