#!/usr/bin/env bash
# The filesystem and container matrix. The ground-truth scenarios (cli/tests/it/fs_matrix.rs,
# fs_matrix_env.rs and fs_matrix_service_user.rs: a lone writer and 1,000 healthy cycles beside
# another process with no alarm, a lone loss healed, a loss with a peer refused and captured, a
# restore with a stale WAL set aside, a restore under a running application, a holder in a sibling
# pid namespace, an unprivileged process in a 0773 directory, a service user — nobody,
# HOME=/nonexistent — in a root-owned 0773 directory it cannot list, with no capture possible
# anywhere, and after a restore there, a loss out of descriptors) run once per filesystem this
# script mounts: ext4, xfs and btrfs on loop images (btrfs at its top and in a subvolume), tmpfs,
# and overlayfs (a lower and an upper directory, as containers use).
#
# Needs root (mount, losetup, unshare, setpriv) and mkfs.xfs / mkfs.btrfs (Debian's xfsprogs and
# btrfs-progs, installed here with apt-get when missing). Without them it fails under CI=true
# (as the crash points do) and is skipped with the reason otherwise. Reuses the build of the
# root `cargo test`; about a minute.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cannot() {
    echo "!! the filesystem matrix cannot run: $1" >&2
    if [ "${CI:-}" = true ]; then
        echo "CI=true: the filesystem matrix is required (tests/fs-matrix.sh)" >&2
        exit 1
    fi
    echo "!! SKIPPED: the filesystem matrix (tests/fs-matrix.sh)" >&2
    # ext/build-and-test.sh names it again in its last line.
    [ -z "${HERMES_GUARD_SKIPS:-}" ] || echo "the filesystem matrix (tests/fs-matrix.sh): $1" >>"$HERMES_GUARD_SKIPS"
    exit 0
}

[ "$(id -u)" = 0 ] || cannot "it needs root to mount loop images"
if ! command -v mkfs.xfs >/dev/null || ! command -v mkfs.btrfs >/dev/null; then
    echo "== installing xfsprogs and btrfs-progs (mkfs.xfs, mkfs.btrfs)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q xfsprogs btrfs-progs >/dev/null 2>&1 \
        || (apt-get update -q >/dev/null 2>&1 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q xfsprogs btrfs-progs >/dev/null 2>&1) \
        || cannot "apt-get install xfsprogs btrfs-progs failed"
fi
for tool in mkfs.ext4 mkfs.xfs mkfs.btrfs losetup unshare setpriv; do
    command -v "$tool" >/dev/null || cannot "$tool is missing"
done

work="$(mktemp -d /tmp/hermes-guard-fs-matrix.XXXXXX)"
chmod 0755 "$work" # an unprivileged process reaches its database below it
mounts=()
cleanup() {
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# mount_image <name> <size> <mkfs command...>: a loop image of its own, mounted at $work/<name>.
mount_image() {
    local name="$1" size="$2"
    shift 2
    truncate -s "$size" "$work/$name.img"
    "$@" "$work/$name.img" >/dev/null 2>&1 || cannot "$* failed"
    mkdir -p "$work/$name"
    mount -o loop "$work/$name.img" "$work/$name" || cannot "mounting the $name image failed"
    mounts+=("$work/$name")
}

mount_image ext4 256M mkfs.ext4 -q -F
mount_image xfs 320M mkfs.xfs -q -f
mount_image btrfs 256M mkfs.btrfs -q -f
btrfs subvolume create "$work/btrfs/subvolume" >/dev/null
mkdir -p "$work/tmpfs"
mount -t tmpfs -o size=256M tmpfs "$work/tmpfs" || cannot "mounting tmpfs failed"
mounts+=("$work/tmpfs")
mkdir -p "$work/ext4/overlay/lower" "$work/ext4/overlay/upper" "$work/ext4/overlay/work" "$work/overlay"
mount -t overlay overlay \
    -o "lowerdir=$work/ext4/overlay/lower,upperdir=$work/ext4/overlay/upper,workdir=$work/ext4/overlay/work" \
    "$work/overlay" || cannot "mounting overlayfs failed"
mounts+=("$work/overlay")

targets=(ext4 xfs btrfs btrfs/subvolume tmpfs overlay)
for target in "${targets[@]}"; do
    dir="$work/$target"
    chmod 0755 "$dir"
    echo "== the ground-truth scenarios on $target ($(stat -f -c %T "$dir"), device $(stat -c %d "$dir"))"
    HERMES_GUARD_MATRIX_DIR="$dir" cargo test -q -p hermes-guard-cli --test it \
        -- --test-threads=2 fs_matrix status_cli::the_status_names_a_local_filesystem
done
echo "== the filesystem matrix passed on: ${targets[*]}"
