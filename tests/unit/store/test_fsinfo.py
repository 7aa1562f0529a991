"""Filesystem detection and the metadata index's journal mode on network filesystems.

No NFS (or Lustre, or SMB) server can run here, so the tests pass recorded mount tables, in the
format of ``/proc/self/mounts``, to ``mounts_file``. Their mount points live under ``tmp_path`` (the
``{root}`` below) so that the real path resolution runs against folders that exist on this machine.
"""

from __future__ import annotations

import logging
import os
import sqlite3

import pytest

from stoker.errors import ConfigError
from stoker.store import MetadataDB
from stoker.store.fsinfo import NETWORK_FS_TYPES, filesystem_type, is_network_fs

# A compute node of a Slurm cluster: overlay root, autofs home with alice's NFSv4 folder mounted in it,
# Lustre scratch with a node-local ext4 folder inside it, a CIFS share whose name has a space.
CLUSTER = r"""overlay / overlay rw,relatime,lowerdir=/var/lib/docker/overlay2/l/ABC,upperdir=/x/diff 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/nvme0n1p2 {root} ext4 rw,relatime 0 0
auto.home {root}/home autofs rw,relatime,fd=7,pgrp=1,timeout=300,minproto=5,maxproto=5,indirect 0 0
nfs01.cluster:/export/home/alice {root}/home/alice nfs4 rw,relatime,vers=4.2,rsize=1048576,hard,proto=tcp 0 0
10.0.0.7@o2ib:/scratch {root}/scratch lustre rw,flock,lazystatfs 0 0
/dev/nvme1n1 {root}/scratch/local ext4 rw,relatime 0 0
//fs.corp/team\040share {root}/mnt/team\040share cifs rw,vers=3.1.1,cache=strict 0 0
"""


def mounts(tmp_path, table: str = CLUSTER):
    """Write ``table`` with ``{root}`` replaced by tmp_path (escaped like the kernel does); return its path."""
    root = os.path.realpath(tmp_path).replace("\\", "\\134").replace(" ", "\\040")
    path = tmp_path / "mounts"
    path.write_text(table.replace("{root}", root))
    return path


@pytest.fixture
def table(tmp_path):
    return mounts(tmp_path)


def test_longest_mount_point_wins(tmp_path, table):
    assert filesystem_type(tmp_path / "home" / "alice" / ".stoker" / "metadata.db", table) == "nfs4"
    assert filesystem_type(tmp_path / "home" / "alice", table) == "nfs4"
    assert filesystem_type(tmp_path / "home" / "bob", table) == "autofs"  # not mounted (yet)
    assert filesystem_type(tmp_path / "scratch" / "run1" / "metadata.db", table) == "lustre"
    assert filesystem_type(tmp_path / "scratch" / "local" / "metadata.db", table) == "ext4"
    assert filesystem_type(tmp_path / "work", table) == "ext4"
    assert filesystem_type("/etc", table) == "overlay"
    assert filesystem_type("/proc/self", table) == "proc"


def test_whole_components_only(tmp_path, table):
    # /home/alice is a mount point; /home/alice2 and /home/alic are not inside it
    assert filesystem_type(tmp_path / "home" / "alice2" / "x", table) == "autofs"
    assert filesystem_type(tmp_path / "home" / "alic", table) == "autofs"
    assert filesystem_type(tmp_path / "scratchy", table) == "ext4"


def test_escaped_space_in_mount_point(tmp_path, table):
    assert filesystem_type(tmp_path / "mnt" / "team share" / "metadata.db", table) == "cifs"
    assert filesystem_type(tmp_path / "mnt" / "team", table) == "ext4"
    assert is_network_fs(tmp_path / "mnt" / "team share", table)


def test_symlinks_resolve_through_nearest_existing_parent(tmp_path, table):
    (tmp_path / "home" / "alice").mkdir(parents=True)
    (tmp_path / "stoker-home").symlink_to(tmp_path / "home" / "alice")
    # metadata.db and its folder do not exist yet: the symlink above them still counts
    assert filesystem_type(tmp_path / "stoker-home" / "new" / "metadata.db", table) == "nfs4"
    (tmp_path / "to-local").symlink_to(tmp_path / "scratch" / "local")
    assert filesystem_type(tmp_path / "to-local" / "metadata.db", table) == "ext4"


def test_later_mount_on_same_point_hides_earlier(tmp_path):
    table = mounts(tmp_path, "/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 {root} ext4 rw 0 0\n"
                             "server:/export {root} nfs rw,vers=3 0 0\n")
    assert filesystem_type(tmp_path / "x.db", table) == "nfs"


def test_is_network_fs(tmp_path, table):
    assert is_network_fs(tmp_path / "home" / "alice" / "metadata.db", table)
    assert is_network_fs(tmp_path / "scratch" / "x", table)
    assert not is_network_fs(tmp_path / "scratch" / "local" / "x", table)
    assert not is_network_fs(tmp_path / "home" / "bob", table)  # autofs itself is only the trigger
    assert not is_network_fs("/etc", table)
    for kind in ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.sshfs",
                 "9p", "glusterfs"):
        assert kind in NETWORK_FS_TYPES
    for kind in ("ext4", "xfs", "btrfs", "overlay", "tmpfs", "zfs", "autofs", "nfsd"):
        assert kind not in NETWORK_FS_TYPES


def test_unreadable_mount_table_is_unknown_and_local(tmp_path):
    assert filesystem_type(tmp_path, tmp_path / "no-such-mounts") == "unknown"
    assert not is_network_fs(tmp_path, tmp_path / "no-such-mounts")


# --- the metadata index on a network filesystem ----------------------------------------------------------

@pytest.fixture
def nfs_table(tmp_path, monkeypatch):
    """A mount table in which tmp_path/nfs is an NFSv4 mount (and $STOKER_SQLITE_JOURNAL is unset)."""
    monkeypatch.delenv("STOKER_SQLITE_JOURNAL", raising=False)
    return mounts(tmp_path, "/dev/vda / ext4 rw 0 0\nnfs01:/export/home {root}/nfs nfs4 rw,vers=4.2 0 0\n")


def test_local_filesystem_uses_wal(tmp_path, nfs_table):
    with MetadataDB(tmp_path / "local" / "metadata.db", mounts_file=nfs_table) as db:
        assert db.journal_mode == "wal"


def test_network_filesystem_uses_rollback_journal(tmp_path, nfs_table, caplog):
    path = tmp_path / "nfs" / "alice" / "metadata.db"
    with caplog.at_level(logging.INFO, logger="stoker.store.metadata"):
        writer = MetadataDB(path, mounts_file=nfs_table)
        reader = MetadataDB(path, mounts_file=nfs_table)  # a second connection, like the CLI next to a run
    try:
        assert writer.journal_mode == reader.journal_mode == "delete"
        writer.create_run("F", "1", user="alice", tags=["t"], params={"lr": 0.1})
        assert [r.pathspec for r in reader.list_runs("F", tags=["t"])] == ["F/1"]
        reader.set_run_status("F", "1", "succeeded")  # either connection can write
        assert writer.get_run("F", "1").status == "succeeded"
    finally:
        writer.close()
        reader.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # stored in the file
    conn.close()
    assert not path.with_name("metadata.db-wal").exists() and not path.with_name("metadata.db-shm").exists()
    fallbacks = [r for r in caplog.records if "network filesystem" in r.getMessage()]
    assert len(fallbacks) == 1 and fallbacks[0].levelno == logging.INFO  # logged once for both
    assert "nfs4" in fallbacks[0].getMessage() and "STOKER_SQLITE_JOURNAL" in fallbacks[0].getMessage()


def test_database_created_in_wal_moves_to_rollback_journal(tmp_path, nfs_table, monkeypatch):
    path = tmp_path / "nfs" / "metadata.db"
    monkeypatch.setenv("STOKER_SQLITE_JOURNAL", "wal")
    with MetadataDB(path, mounts_file=nfs_table) as db:
        db.create_run("F", "1", user="alice", params={})
    monkeypatch.delenv("STOKER_SQLITE_JOURNAL")
    with MetadataDB(path, mounts_file=nfs_table) as db:
        assert db.journal_mode == "delete" and db.get_run("F", "1").user == "alice"


@pytest.mark.parametrize(("value", "local", "network"), [
    ("wal", "wal", "wal"), ("DELETE", "delete", "delete"), (" truncate ", "truncate", "truncate"),
    ("", "wal", "delete"),  # empty = unset
])
def test_env_override_wins(tmp_path, nfs_table, monkeypatch, value, local, network):
    monkeypatch.setenv("STOKER_SQLITE_JOURNAL", value)
    for folder, expected in (("local", local), ("nfs", network)):
        with MetadataDB(tmp_path / folder / "metadata.db", mounts_file=nfs_table) as db:
            assert db.journal_mode == expected
            db.create_run("F", "1", user="alice", params={})
            assert [r.run_id for r in db.list_runs("F")] == ["1"]


def test_invalid_env_value_is_a_config_error(tmp_path, nfs_table, monkeypatch):
    monkeypatch.setenv("STOKER_SQLITE_JOURNAL", "memory")
    with pytest.raises(ConfigError, match=r"STOKER_SQLITE_JOURNAL='memory'.*wal, delete, truncate"):
        MetadataDB(tmp_path / "nfs" / "metadata.db", mounts_file=nfs_table)
    assert not (tmp_path / "nfs").exists()  # failed before creating anything


def test_mode_kept_while_another_connection_holds_wal(tmp_path, nfs_table, monkeypatch, caplog):
    path = tmp_path / "nfs" / "metadata.db"
    monkeypatch.setenv("STOKER_SQLITE_JOURNAL", "wal")
    with MetadataDB(path, mounts_file=nfs_table) as first:
        monkeypatch.delenv("STOKER_SQLITE_JOURNAL")
        with caplog.at_level(logging.WARNING, logger="stoker.store.metadata"), \
                MetadataDB(path, mounts_file=nfs_table) as second:
            assert second.journal_mode == "wal"  # what is in effect, not what was asked for
            first.create_run("F", "1", user="alice", params={})
            assert second.get_run("F", "1") is not None
    assert any("stays in journal mode wal instead of delete" in r.getMessage() for r in caplog.records)
