/** The loadable extension's absolute path. */
export const extensionPath: string;
/** The `hermes-guard` command's absolute path. */
export const cliPath: string;
export const ENTRY_POINT: string;
export const DEFAULT_ENTRY_POINT: string;

/** The guard's status of a connection's main database (`SELECT hermes_guard_status()`). */
export interface GuardStatus {
  database: string;
  retired: boolean;
  reason: string | null;
  capture: string | null;
  [key: string]: unknown;
}

/** Makes hermes-guard the default VFS of better-sqlite3's SQLite: pass its Database class. */
export function enable(Database: new (filename: string, options?: object) => unknown): void;
/** The guard's status of `db`'s main database. */
export function status(db: { prepare(sql: string): unknown }): GuardStatus;
/** Whether `error` is the guard's refusal of a write into a retired generation (1032). */
export function isRetired(error: unknown): boolean;
