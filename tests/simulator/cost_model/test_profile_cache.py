"""The binary copy of a large operator profile (``profile_cache``): the same profile as the
YAML, used only while the YAML keeps its bytes, written beside a profile kvsim wrote and
nowhere it may not write (a file of the user's is never replaced). Load times are measured
by ``benchmarks/profile_load.py``, not here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kvsim.simulator.cost_model import operator_profile as op
from kvsim.simulator.cost_model import profile_cache
from kvsim.simulator.cost_model.import_files import write_with_sources

SHIPPED = op.PROFILES_DIR / "rtx4090-llama-3.1-8b.yaml"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No profile in memory, every profile large enough to copy, the user's cache in tmp_path."""
    monkeypatch.setattr(op, "_CACHE", {})
    monkeypatch.setattr(profile_cache, "MIN_BYTES", 0)
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "user-cache"))
    return tmp_path


def read(path: Path) -> op.OperatorProfile:
    op._CACHE.clear()  # as a new process would
    return op.read_operator_profile(path)


def kvsim_wrote(folder: Path) -> Path:
    """The shipped profile, written into ``folder`` as ``kvsim calibrate --import`` writes one."""
    profile = op._Reader(str(SHIPPED)).profile(yaml.safe_load(SHIPPED.read_text()))  # no copy made here
    return write_with_sources(profile, folder, None, None)


def no_yaml(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the YAML was parsed")
    monkeypatch.setattr(op.yaml, "load", refuse)


def test_a_profile_kvsim_wrote_is_read_from_its_copy_beside_it(fresh, monkeypatch):
    path = kvsim_wrote(fresh / "profiles")
    first = read(path)
    copy = profile_cache.beside(path)
    assert copy.is_file() and copy.read_bytes().startswith(profile_cache.MAGIC)
    assert not (fresh / "user-cache").exists()
    parsed = yaml.safe_load(path.read_text())
    no_yaml(monkeypatch)
    again = read(path)
    assert again == first and again.to_dict() == first.to_dict()
    assert profile_cache.load(path, profile_cache.source_digest(path.read_bytes())) == parsed  # the YAML's data


def test_a_changed_profile_is_parsed_again(fresh):
    path = kvsim_wrote(fresh / "profiles")
    read(path)
    data = yaml.safe_load(path.read_text())
    data["tp"][1]["dense"]["qkv_proj"]["time_us"][0] += 1000.0
    path.write_text(yaml.safe_dump(data))
    changed = read(path)
    assert changed.tp[1].dense["qkv_proj"].seconds[0] == pytest.approx(data["tp"][1]["dense"]["qkv_proj"]["time_us"][0]
                                                                       * 1e-6)


def test_a_broken_copy_is_ignored(fresh):
    path = kvsim_wrote(fresh / "profiles")
    good = read(path)
    copy = profile_cache.beside(path)
    raw = copy.read_bytes()
    copy.write_bytes(raw[: len(raw) // 2])  # truncated
    assert read(path) == good


def test_a_file_kvsim_did_not_write_is_never_replaced(fresh):
    path = kvsim_wrote(fresh / "profiles")
    mine = profile_cache.beside(path)
    mine.write_text("my notes\n")
    profile = read(path)
    assert mine.read_text() == "my notes\n"
    copies = list((fresh / "user-cache").rglob("*.kvsim-cache"))
    assert len(copies) == 1  # the copy went to the user's cache folder instead
    assert read(path) == profile


def test_a_profile_kvsim_did_not_write_is_copied_to_the_user_cache_only(fresh, monkeypatch):
    theirs = fresh / "theirs"
    theirs.mkdir()
    path = Path(shutil.copy(SHIPPED, theirs / "profile.yaml"))
    first = read(path)
    assert sorted(p.name for p in theirs.iterdir()) == ["profile.yaml"]  # nothing added to their folder
    digest = profile_cache.source_digest(path.read_bytes())
    assert profile_cache.in_user_cache(digest).is_file()
    no_yaml(monkeypatch)
    assert read(path) == first


def test_nowhere_to_write_leaves_the_profile_in_memory(fresh, monkeypatch):
    blocker = fresh / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(blocker / "cache"))  # cannot be made
    theirs = fresh / "theirs"
    theirs.mkdir()
    path = Path(shutil.copy(SHIPPED, theirs / "profile.yaml"))
    assert read(path).name == "rtx4090-llama-3.1-8b"
    assert sorted(p.name for p in theirs.iterdir()) == ["profile.yaml"]


def test_small_profiles_are_not_copied(monkeypatch, tmp_path):
    monkeypatch.setattr(op, "_CACHE", {})
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "user-cache"))
    assert SHIPPED.stat().st_size < profile_cache.MIN_BYTES
    op.read_operator_profile(SHIPPED)
    assert not (tmp_path / "user-cache").exists()
    assert not profile_cache.beside(SHIPPED).exists()


def test_the_encoding_keeps_every_value_and_type():
    data = {"a": [1, 2, 3, 4, 5, 6, 7, 8, 9], "b": [0.5, None, 2.0, 3.25, None, 1e-6, 7.0, 8.0],
            "tp": {1: {"x": [1, 2]}, 2: {"x": []}}, "s": "text", "n": None, "$odd": True,
            "mixed": [1, 2.5, 3, 4, 5, 6, 7, 8], "big": [2**70] * 9, "strings": ["a"] * 9}
    back = profile_cache.decode(profile_cache.encode(data))
    assert back == data
    assert [type(x) for x in back["mixed"]] == [type(x) for x in data["mixed"]]
    assert list(back["tp"]) == [1, 2]


def test_a_shipped_profile_never_gets_a_copy_beside_it(fresh, monkeypatch):
    """The package's profiles folder is package data: even a profile kvsim wrote there (the
    importer, asked to) has its copy in the user's cache folder."""
    shipped = fresh / "package-profiles"
    path = kvsim_wrote(shipped)
    monkeypatch.setattr(op, "PROFILES_DIR", shipped)
    read(path)
    assert not profile_cache.beside(path).exists()
    assert profile_cache.in_user_cache(profile_cache.source_digest(path.read_bytes())).is_file()


def test_without_a_named_cache_folder_nothing_is_written_outside(monkeypatch, tmp_path):
    """kvsim writes only where asked: no $KVSIM_CACHE_DIR, no copy in a home or XDG cache."""
    monkeypatch.setattr(op, "_CACHE", {})
    monkeypatch.setattr(profile_cache, "MIN_BYTES", 0)
    monkeypatch.delenv("KVSIM_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    path = Path(shutil.copy(SHIPPED, theirs / "profile.yaml"))
    assert read(path).name == "rtx4090-llama-3.1-8b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]
    assert sorted(p.name for p in theirs.iterdir()) == ["profile.yaml"]
