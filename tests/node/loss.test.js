// hermes-guard in Node, through better-sqlite3: the extension is loaded once with the entry point
// that makes the guard the default VFS, and every Database opened afterwards is guarded
// (better-sqlite3 compiles SQLite without URI filenames, so `?vfs=` is not available, and it opens
// a file only after `new Database`: the one-throwaway-connection bootstrap).
//
// Run by tests/node.sh (from ext/build-and-test.sh) with node --test, twice: by hand, and through
// the npm package installed from its tarball.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const Database = require('better-sqlite3');

// Through the npm package (HERMES_GUARD_NPM: its installed folder, tests/node.sh packs and
// installs it), or by hand (HERMES_GUARD_EXT, HERMES_GUARD_CLI: the bootstrap below, docs/hosts.md's
// recipe for a build of the repository).
const npm = process.env.HERMES_GUARD_NPM;
let cli;
if (npm) {
  const guard = require(npm);
  guard.enable(Database);
  guard.enable(Database); // idempotent
  cli = guard.cliPath;
  assert.ok(fs.existsSync(guard.extensionPath), guard.extensionPath);
} else {
  const ext = process.env.HERMES_GUARD_EXT;
  cli = process.env.HERMES_GUARD_CLI;
  assert.ok(ext && fs.existsSync(ext), `HERMES_GUARD_EXT names the extension (${ext})`);
  // The bootstrap: a throwaway in-memory connection loads the extension, permanently, for the
  // process; the guard becomes the default VFS.
  const boot = new Database(':memory:');
  boot.loadExtension(ext, 'sqlite3_hermesguard_default_init');
  boot.close();
}
assert.ok(cli && fs.existsSync(cli), `the command is there (${cli})`);

function tempdir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'hermes-guard-node-'));
}

function open(file) {
  const db = new Database(file);
  assert.equal(db.pragma('journal_mode = WAL', { simple: true }), 'wal');
  db.exec('CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)');
  return db;
}

// Run as the newer generation's process: 5 rows into the database named, then exit.
if (process.env.HERMES_GUARD_NODE_NEWER) {
  const db = open(process.env.HERMES_GUARD_NODE_NEWER);
  for (let i = 0; i < 5; i++) db.prepare('INSERT INTO t (v) VALUES (?)').run(`newer ${i}`);
  db.close();
  process.exit(0);
}

function status(db) {
  return JSON.parse(db.prepare('SELECT hermes_guard_status()').pluck().get());
}

// `hermes-guard captures --json`: exit 0 (nothing missing) or 3 (rows of a capture missing from
// the live database); each capture names the command that brings its rows back.
function captures(file) {
  const r = spawnSync(cli, ['captures', file, '--json'], { encoding: 'utf8' });
  assert.ok(r.status === 0 || r.status === 3, `captures exited ${r.status}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

test('a Database opened after the bootstrap is guarded', () => {
  const dir = tempdir();
  const db = open(path.join(dir, 'state.db'));
  const s = status(db);
  assert.equal(s.retired, false);
  assert.equal(db.prepare("SELECT name FROM pragma_database_list WHERE name = 'main'").pluck().get(), 'main');
  db.close();
  fs.rmSync(dir, { recursive: true });
});

test('a -wal lost under a writer: the next write is refused with SQLITE_READONLY_DBMOVED, the generation captured, and recover brings every acknowledged row back once', () => {
  const dir = tempdir();
  const file = path.join(dir, 'state.db');
  const db = open(file);
  db.pragma('wal_autocheckpoint = 0');
  const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
  const acknowledged = [];
  for (let i = 0; i < 20; i++) {
    insert.run(`before ${i}`);
    acknowledged.push(`before ${i}`);
  }
  // The rows live only in the WAL when it is taken away, with its -shm.
  fs.unlinkSync(`${file}-wal`);
  fs.unlinkSync(`${file}-shm`);
  assert.throws(() => insert.run('after the loss'), (e) => {
    assert.equal(e.code, 'SQLITE_READONLY_DBMOVED', `${e.code}: ${e.message}`);
    return true;
  });
  const s = status(db);
  assert.equal(s.retired, true);
  assert.equal(s.reason, 'wal-lost');
  assert.ok(s.capture && fs.existsSync(path.join(s.capture, 'manifest.json')), JSON.stringify(s));

  // A newer generation at the path, while the retired connection is still open: another
  // process writes on (in this one SQLite's unix VFS would join the retired connection's
  // mapping of the unlinked -shm), so the retired connection's close cannot heal its rows back:
  // they stay in the capture.
  const newer = spawnSync(process.execPath, [__filename], {
    env: { ...process.env, HERMES_GUARD_NODE_NEWER: file },
    encoding: 'utf8',
  });
  assert.equal(newer.status, 0, newer.stderr);
  for (let i = 0; i < 5; i++) acknowledged.push(`newer ${i}`);
  db.close();

  const listed = captures(file);
  assert.equal(listed.length, 1, JSON.stringify(listed));
  assert.equal(listed[0].healed, false, JSON.stringify(listed[0]));
  assert.equal(listed[0].missing, 20, JSON.stringify(listed[0]));
  execFileSync(cli, [...listed[0].recover, '--apply'], { encoding: 'utf8' });
  assert.equal(captures(file)[0].missing, 0);
  const after = new Database(file);
  const counts = new Map();
  for (const v of after.prepare('SELECT v FROM t').pluck().all()) {
    counts.set(v, (counts.get(v) || 0) + 1);
  }
  assert.equal(after.pragma('integrity_check', { simple: true }), 'ok');
  after.close();
  for (const v of acknowledged) {
    assert.equal(counts.get(v), 1, `row ${v} is live ${counts.get(v) || 0} times`);
  }
  fs.rmSync(dir, { recursive: true });
});
