"""Per-process memo of ssh config, known_hosts and identity files (gpuctl.transport.filememo): read
once while unchanged, read again after any edit, create or removal, never stale."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sshd import keygen

import gpuctl.transport.filememo as filememo
from gpuctl.transport import knownhosts, sshconfig, sshkeys
from gpuctl.transport.filememo import FileMemo
from gpuctl.transport.knownhosts import KnownHosts
from gpuctl.transport.sshconfig import SshConfigError, load_config, resolve_host
from gpuctl.transport.sshkeys import KeyLoadError, load_private_key


#: The racy window in these tests (seconds; filememo.RACY_S is 1.0).
RACY_S = 0.05


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    """Files count as settled RACY_S after their last change (ctime, which utime moves too)."""
    monkeypatch.setattr(filememo, "RACY_S", RACY_S)


def _age(path: Path, seconds: float = 5.0) -> None:
    """Set the mtime `seconds` in the past as a file edited earlier, and wait out the racy window
    of its ctime (which nobody can set back)."""
    t = time.time() - seconds
    os.utime(path, (t, t))
    time.sleep(RACY_S * 1.5)


def _counting(path: Path, calls: list[int]):
    def compute():
        calls.append(1)
        return path.read_text(), (str(path),)
    return compute


def test_value_kept_while_file_unchanged_and_read_again_after_edit(tmp_path):
    f = tmp_path / "a"
    f.write_text("one")
    _age(f)
    memo, calls = FileMemo(), []
    for _ in range(3):  # the first read learns the files, the second confirms them unchanged
        assert memo.get("k", _counting(f, calls)) == "one"
    assert (len(calls), memo.hits, memo.misses) == (2, 1, 2)
    f.write_text("two!")  # new size and mtime
    assert memo.get("k", _counting(f, calls)) == "two!"
    assert len(calls) == 3


def test_same_size_same_second_edit_is_seen(tmp_path):
    """A file read right after it was written is not remembered (racy window), so an edit keeping
    the size within the same timestamp tick is still read."""
    f = tmp_path / "a"
    f.write_text("aaaa")
    memo, calls = FileMemo(), []
    assert memo.get("k", _counting(f, calls)) == "aaaa"
    f.write_text("bbbb")
    assert memo.get("k", _counting(f, calls)) == "bbbb"
    assert len(calls) == 2 and memo.hits == 0


def test_removed_and_created_files_are_seen(tmp_path):
    f = tmp_path / "a"
    f.write_text("x")
    _age(f)
    memo = FileMemo()
    compute = lambda: (f.exists(), (str(f),))  # noqa: E731
    assert memo.get("k", compute) is True
    f.unlink()
    assert memo.get("k", compute) is False  # stat before and after: confirmed as missing
    assert memo.get("k", compute) is False and memo.hits == 1  # a missing file is remembered as missing
    f.write_text("y")
    assert memo.get("k", compute) is True


def test_errors_are_not_remembered_and_none_paths_not_kept(tmp_path):
    memo = FileMemo()
    calls = []

    def boom():
        calls.append(1)
        raise ValueError("bad")
    for _ in range(2):
        with pytest.raises(ValueError, match="bad"):
            memo.get("k", boom)
    assert len(calls) == 2 and memo.hits == 0
    assert memo.get("n", lambda: (calls.append(1) or 5, None)) == 5
    assert memo.get("n", lambda: (calls.append(1) or 6, None)) == 6


def test_maxsize_drops_oldest(tmp_path):
    f = tmp_path / "a"
    f.write_text("x")
    _age(f)
    memo = FileMemo(maxsize=2)
    for k in "abcc":
        memo.get(k, lambda k=k: (k, (str(f),)))
    assert memo.get("a", lambda: ("again", (str(f),))) == "again"
    assert memo.get("c", lambda: ("never", (str(f),))) == "c"


def test_ssh_config_parsed_once_and_again_after_include_changes(tmp_path):
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "a.conf").write_text("Host a\n  Port 2201\n")
    main = tmp_path / "config"
    main.write_text("Include conf.d/*.conf\nHost *\n  User u\n")
    for p in (inc / "a.conf", main, inc):
        _age(p)
    load_config(str(main), include_dir=str(tmp_path))
    c1 = load_config(str(main), include_dir=str(tmp_path))
    assert load_config(str(main), include_dir=str(tmp_path)) is c1
    assert resolve_host("a", config=c1).port == 2201
    # a new file in the Include directory (its mtime moves)
    (inc / "b.conf").write_text("Host b\n  Port 2202\n")
    c2 = load_config(str(main), include_dir=str(tmp_path))
    assert c2 is not c1 and resolve_host("b", config=c2).port == 2202
    # an edit of an included file, long after the config was remembered
    for p in (inc / "b.conf", inc):
        _age(p, 10)
    load_config(str(main), include_dir=str(tmp_path))
    c3 = load_config(str(main), include_dir=str(tmp_path))
    assert load_config(str(main), include_dir=str(tmp_path)) is c3
    (inc / "b.conf").write_text("Host b\n  Port 2203\n")
    assert resolve_host("b", config=load_config(str(main), include_dir=str(tmp_path))).port == 2203


def test_ssh_config_error_is_raised_every_time_and_state_unchanged(tmp_path):
    main = tmp_path / "config"
    main.write_text("Host a\n  Port 22\n")
    _age(main)
    good = load_config(str(main))
    main.write_text("Host a\n  Port notaport\n")
    for _ in range(2):
        with pytest.raises(SshConfigError, match=rf"{main}:2"):
            load_config(str(main))
    main.write_text("Host a\n  Port 22\n")
    _age(main)
    assert resolve_host("a", config=load_config(str(main))).port == 22
    assert good is not None


def test_glob_in_directory_name_is_never_remembered(tmp_path):
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "c").write_text("Host a\n  Port 2201\n")
    main = tmp_path / "config"
    main.write_text("Include d*/c\n")
    for p in (main, tmp_path / "d1" / "c", tmp_path / "d1", tmp_path):
        _age(p)
    c1 = load_config(str(main), include_dir=str(tmp_path))
    assert load_config(str(main), include_dir=str(tmp_path)) is not c1


def test_known_hosts_read_once_and_after_add(tmp_path):
    kh = tmp_path / "known_hosts"
    blob = b"\x00\x00\x00\x0bssh-ed25519" + b"\x00\x00\x00\x20" + bytes(32)
    import base64
    kh.write_text(f"host1 ssh-ed25519 {base64.b64encode(blob).decode()}\n")
    _age(kh)
    hits = knownhosts._PARSED.hits
    a = KnownHosts(str(kh))
    KnownHosts(str(kh))
    b = KnownHosts(str(kh))
    assert knownhosts._PARSED.hits == hits + 1
    assert a.check("host1", blob).status == "ok" and b.check("host1", blob).status == "ok"
    other = blob[:-1] + b"\x01"
    b.add("host2", "ssh-ed25519", other)
    assert KnownHosts(str(kh)).check("host2", other).status == "ok"
    assert a.check("host2", other).status == "unknown"  # an instance's lines are its own
    a.lines.clear()  # a caller changing its copy does not change the memo
    assert KnownHosts(str(kh)).check("host1", blob).status == "ok"


def test_private_key_loaded_once_unless_changed_or_encrypted(tmp_path):
    k = keygen(tmp_path / "id")
    _age(k)
    load_private_key(str(k))
    k1 = load_private_key(str(k))
    assert load_private_key(str(k)) is k1
    os.unlink(k)
    os.unlink(str(k) + ".pub")
    keygen(tmp_path / "id")
    k2 = load_private_key(str(k))
    assert k2.asbytes() != k1.asbytes()
    enc = keygen(tmp_path / "enc", passphrase="pw")
    _age(enc)
    e1 = load_private_key(str(enc), "pw")
    assert load_private_key(str(enc), "pw") is not e1  # a decrypted key is not kept
    with pytest.raises(KeyLoadError, match="is encrypted"):
        load_private_key(str(enc))
    assert sshkeys._LOADED.get(str(enc), lambda: ("nothing kept", None)) == "nothing kept"


def test_modules_share_the_one_memo_class():
    assert isinstance(sshconfig._PARSED, filememo.FileMemo)
    assert isinstance(knownhosts._PARSED, filememo.FileMemo)
    assert isinstance(sshkeys._LOADED, filememo.FileMemo)


def test_rewrite_keeping_inode_size_and_mtime_is_seen(tmp_path):
    """A rewrite that puts the old mtime back (cp -p, touch -r, a restored backup) with the same
    size: only the ctime moves, and that is enough."""
    f = tmp_path / "a"
    f.write_text("aaaa")
    _age(f)
    memo, calls = FileMemo(), []
    for _ in range(3):
        assert memo.get("k", _counting(f, calls)) == "aaaa"
    assert memo.hits == 1
    st = os.stat(f)
    with open(f, "r+") as fh:  # same inode
        fh.write("bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(f).st_ino, os.stat(f).st_size, os.stat(f).st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert memo.get("k", _counting(f, calls)) == "bbbb"
    os.chmod(f, 0o600)  # a mode change (unreadable for a non-root user) is read again too
    assert memo.get("k", _counting(f, calls)) == "bbbb" and len(calls) == 4


def test_a_file_replaced_while_it_is_read_is_never_remembered_stale(tmp_path):
    """known_hosts is a symlink swapped, while it is being read, to an older file (its ctime
    outside the racy window): the value read is from the old target, the stat after the read sees
    the new one. It must not be handed out for the new one."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text("old key")
    new.write_text("new key")
    link = tmp_path / "known_hosts"
    link.symlink_to(old)
    for p in (old, new):
        _age(p)
    memo = FileMemo()

    def swapping_read():
        text = link.read_text()
        tmp = tmp_path / "swap"
        tmp.symlink_to(new)
        os.replace(tmp, link)  # the swap lands between the read and the stat after it
        return text, (str(link),)

    assert memo.get("k", swapping_read) == "old key"
    assert memo.get("k", _counting(link, [])) == "new key"
    assert memo.get("k", _counting(link, [])) == "new key"  # and from now on remembered
    assert memo.get("k", swapping_read) == "new key" and memo.hits == 2
