//! The WAL file object's write gate, as the state holds it.

/// The write gate of the WAL file object, which the shim installs and the state opens and
/// closes. Open, SQLite's WAL writes go straight to the wrapped file with nothing of the
/// guard's in between: SQLite writes the WAL only under the WAL write lock (its sole writer),
/// and every acquisition of that lock ran the guard's check first, in the same transaction.
/// Closed, each WAL write goes through the guard's gate
/// ([`super::ConnectionState::wal_write_gate`]). It is closed from the retirement on (every write
/// refused) and while the main file is locked above SHARED: `locking_mode=EXCLUSIVE` writes the WAL
/// without taking the write lock.
///
/// The gate is only moved under the state's mutex and from inside the connection's own calls
/// (a retirement, a lock of the main file), which SQLite serialises with the WAL writes it
/// makes; the shim detaches it before it frees the WAL file object.
pub(crate) trait WalGate: Send {
    /// Opens (`true`) or closes the gate.
    fn set_open(&self, open: bool);
}

#[derive(Default)]
pub(super) struct WalGateSlot {
    /// The open WAL file object's write gate, while SQLite has it open.
    pub(super) gate: Option<Box<dyn WalGate>>,
    /// A WAL-base record waits for the WAL header this transaction writes (`vfs/stale_wal/`):
    /// the WAL's gate stays closed until then.
    pub(super) header_record: bool,
}

impl WalGateSlot {
    /// Opens or closes the WAL's gate as the generation (`retired`) and the main file's lock now
    /// require.
    pub(super) fn sync(&self, retired: bool, main_above_shared: bool) {
        if let Some(gate) = &self.gate {
            gate.set_open(!retired && !main_above_shared && !self.header_record);
        }
    }
}

impl super::Inner {
    /// Opens or closes the WAL's gate as the generation and the main file's lock now require.
    pub(super) fn sync_wal_gate(&self, main_above_shared: bool) {
        self.wal_gate
            .sync(self.loss.reason.is_some(), main_above_shared);
    }
}
