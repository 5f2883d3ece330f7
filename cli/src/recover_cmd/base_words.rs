//! A capture's base in an operator's words, the same in `captures`, `recover` and `verify`: what
//! its main image is, and what that means for their data. What the capture recorded as the
//! evidence (the manifest's `base.evidence`) is printed under it with `--verbose`.

use hermes_guard::manifest::{BaseVerdict, ImageMode, Manifest};
use hermes_guard::recover::MergeRule;

/// What the capture's main image is, for the person who will recover from it.
pub(crate) fn image_words(m: &Manifest) -> &'static str {
    if m.main.mode == ImageMode::Absent {
        return "this capture holds no main image (a stale WAL set aside at the open)";
    }
    match m.base_verdict() {
        BaseVerdict::Own => {
            "this capture's main image is the database file as this generation left it"
        }
        BaseVerdict::NotOwn => {
            "this capture's main image is not the file this generation was written on (the \
             database file was replaced or overwritten under it)"
        }
        BaseVerdict::Unknown => {
            "this capture's main image may include a newer generation's changes"
        }
    }
}

/// What recovery does with it: from the rule a plan chose when there is one (`rule`), else from
/// the image alone.
pub(crate) fn recovery_words(m: &Manifest, rule: Option<MergeRule>) -> &'static str {
    if m.main.mode == ImageMode::Absent {
        return "recovery needs the database file its WAL was written on (--main), and replays \
                what this generation did to it";
    }
    if rule == Some(MergeRule::Changes) {
        return "recovery applies this generation's own inserts, updates and deletes, read from \
                the pages its WAL carries against their kept bases (a live row it did not \
                change is never touched)";
    }
    let replays = match rule {
        Some(MergeRule::Delta | MergeRule::DeltaSharedWal) => true,
        Some(_) => false,
        None => m.base_verdict() == BaseVerdict::Own,
    };
    if replays {
        "recovery replays the whole generation (the rows it added, changed and deleted)"
    } else {
        "recovery adds only missing rows (no live row is changed or deleted)"
    }
}

/// `captures`' base line: the verdict's word, what the image is, and what recovery does.
pub(crate) fn captures_line(m: &Manifest, rule: Option<MergeRule>) -> String {
    format!(
        "base {}: {}: {}",
        m.base_verdict().word(),
        image_words(m),
        recovery_words(m, rule)
    )
}

/// `recover`'s and `verify`'s: the verdict's word and what the image is (their `case` line, or
/// the plan, says what recovery does).
pub(crate) fn image_line(m: &Manifest) -> String {
    format!("{}: {}", m.base_verdict().word(), image_words(m))
}
