"""Which filesystem a path lives on, from the kernel's mount table (Linux ``/proc/self/mounts``).

The metadata index needs it: SQLite's WAL mode keeps its index in shared memory (a memory-mapped
``-shm`` file), which is not coherent across the hosts of a network filesystem, so a database on NFS,
Lustre, GPFS, ... must use a rollback journal instead. The mount table is a parameter so that tests can
pass a recorded one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MOUNTS_FILE = "/proc/self/mounts"

#: Filesystem types (the third field of a mount table line) whose files other hosts share. FUSE
#: filesystems show up as ``fuse.<program>``.
NETWORK_FS_TYPES: frozenset[str] = frozenset({
    # NFS, SMB/CIFS, AFS and friends
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "9p", "davfs",
    # parallel and cluster filesystems of HPC sites
    "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "panfs", "pvfs2", "orangefs", "wekafs", "gfs2",
    "ocfs2", "xtreemfs",
    # FUSE clients of the same (and of object stores)
    "fuse.sshfs", "fuse.glusterfs", "fuse.ceph", "fuse.ceph-fuse", "fuse.cephfs", "fuse.beegfs",
    "fuse.juicefs", "fuse.mfs", "fuse.lizardfs", "fuse.quobyte", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.rclone", "fuse.davfs", "fuse.weka",
})

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    r"""Undo the kernel's escaping of space, tab, newline and backslash (``\040``, ``\011``, ...)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mounts_file: str | Path) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every line of a mount table, in its order."""
    with open(mounts_file, encoding="utf-8", errors="surrogateescape") as f:
        rows = [line.split() for line in f]
    return [(_unescape(r[1]), r[2]) for r in rows if len(r) >= 3]


def _under(path: str, mount_point: str) -> bool:
    """Whether ``path`` is ``mount_point`` or inside it (whole components: /home/al is not under /home/a)."""
    mount_point = mount_point.rstrip("/")
    return path == mount_point or path.startswith(mount_point + "/")


def filesystem_type(path: str | Path, mounts_file: str | Path = MOUNTS_FILE) -> str:
    """The type (``ext4``, ``nfs4``, ``lustre``, ...) of the filesystem holding ``path``.

    ``path`` need not exist: symlinks are resolved up to its nearest existing parent and the rest is
    kept, so a file about to be created gets the type of the folder it will be created in. The
    mount point that is the longest prefix of the resolved path wins; of two mounts on the same point
    the later one (which hides the first). Returns ``"unknown"`` when the mount table cannot be read
    (not Linux) or has no matching line.
    """
    resolved = os.path.realpath(os.path.expanduser(os.fspath(path)))
    try:
        mounts = _mounts(mounts_file)
    except OSError:
        return "unknown"
    best, fstype = -1, "unknown"
    for mount_point, kind in mounts:
        if _under(resolved, mount_point) and len(mount_point.rstrip("/")) >= best:
            best, fstype = len(mount_point.rstrip("/")), kind
    return fstype


def is_network_fs(path: str | Path, mounts_file: str | Path = MOUNTS_FILE) -> bool:
    """Whether ``path`` is on a network or cluster filesystem (one of :data:`NETWORK_FS_TYPES`)."""
    return filesystem_type(path, mounts_file) in NETWORK_FS_TYPES
