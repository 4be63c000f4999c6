"""Bundle digests: what changes them, what does not, and what is re-read from disk."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from reactantserver.worker.repository.digest import BundleDigester, dir_identity


def _bundle(root: Path, name: str = "mlp") -> Path:
    bundle = root / name
    (bundle / "modules" / "backbone" / "variants").mkdir(parents=True)
    (bundle / "manifest.yaml").write_text("format_version: '3.0'\n")
    (bundle / "model.b1.mlir").write_text("module @b1 {}\n")
    (bundle / "weights.safetensors").write_bytes(bytes(range(256)) * 16)
    (bundle / "model.py").write_text("def preprocess(x):\n    return x\n")
    (bundle / "modules" / "backbone" / "model.b4.mlir").write_text("module @b4 {}\n")
    (bundle / "modules" / "backbone" / "variants" / "640x480.mlir").write_text("module @v {}\n")
    return bundle


def _bump_ctime(path: Path, before_ns: int) -> None:
    """Move ``path``'s ctime past ``before_ns`` without touching its content or mtime.

    ctime has the kernel clock's tick granularity; re-setting the same times stamps a fresh
    ctime each time, so this spins (no sleep) until the tick has moved on.
    """
    for _ in range(10_000_000):
        st = os.stat(path)
        if st.st_ctime_ns != before_ns:
            return
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    raise AssertionError("ctime never moved")


def test_same_content_gives_the_same_digest(tmp_path: Path) -> None:
    digester = BundleDigester()
    first = _bundle(tmp_path / "a")
    second = _bundle(tmp_path / "b")
    d = digester.digest(first)
    assert len(d) == 64
    assert int(d, 16) >= 0
    assert digester.digest(first) == d
    assert digester.digest(second) == d
    assert BundleDigester().digest(first) == d


def test_digest_is_blake2b_over_sorted_relative_paths_and_content_hashes(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "sub").mkdir(parents=True)
    big = os.urandom(5 * (1 << 19))  # 2.5 MiB: several read chunks
    (bundle / "z.bin").write_bytes(big)
    (bundle / "sub" / "a.txt").write_bytes(b"hello")
    (bundle / "manifest.yaml").write_bytes(b"m")
    expected = hashlib.blake2b(digest_size=32)
    for rel, content in sorted([("z.bin", big), ("sub/a.txt", b"hello"), ("manifest.yaml", b"m")]):
        expected.update(rel.encode() + b"\0" + hashlib.blake2b(content, digest_size=32).digest())
    assert BundleDigester().digest(bundle) == expected.hexdigest()


def test_a_content_change_is_caught_even_with_mtime_restored(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    weights = bundle / "weights.safetensors"
    st = os.stat(weights)
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF
    with open(weights, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    _bump_ctime(weights, st.st_ctime_ns)
    after = os.stat(weights)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )
    assert digester.digest(bundle) != before


def test_touch_rehashes_but_keeps_the_digest(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    hashed = digester.hashed_files
    os.utime(bundle / "model.py", ns=(1_000_000_000, 1_000_000_000))
    assert digester.digest(bundle) == before
    assert digester.hashed_files == hashed + 1


def test_chmod_rehashes_but_keeps_the_digest(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    hashed = digester.hashed_files
    manifest = bundle / "manifest.yaml"
    ctime = os.stat(manifest).st_ctime_ns
    manifest.chmod(0o600)
    _bump_ctime(manifest, ctime)
    assert digester.digest(bundle) == before
    assert digester.hashed_files == hashed + 1


def test_unchanged_files_are_not_rehashed(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    digester.digest(bundle)
    assert digester.hashed_files == 6
    digester.digest(bundle)
    assert digester.hashed_files == 6
    (bundle / "model.py").write_text("def preprocess(x):\n    return x + 1\n")
    changed = digester.digest(bundle)
    assert digester.hashed_files == 7
    assert digester.digest(bundle) == changed
    assert digester.hashed_files == 7


def test_hidden_files_and_directories_are_ignored(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    (bundle / ".DS_Store").write_bytes(b"junk")
    (bundle / ".git" / "objects").mkdir(parents=True)
    (bundle / ".git" / "objects" / "ab").write_bytes(b"blob")
    (bundle / "modules" / ".partial").write_bytes(b"half")
    (bundle / "modules" / ".cache").mkdir()
    (bundle / "modules" / ".cache" / "x").write_bytes(b"x")
    assert digester.digest(bundle) == before
    assert digester.hashed_files == 6


def test_nested_modules_and_variants_are_covered(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    variant = bundle / "modules" / "backbone" / "variants" / "640x480.mlir"
    variant.write_text("module @v2 {}\n")
    changed = digester.digest(bundle)
    assert changed != before
    # A new variant, and the same content under another path, are changes too.
    (bundle / "modules" / "backbone" / "variants" / "320x240.mlir").write_text("module @s {}\n")
    added = digester.digest(bundle)
    assert added not in (before, changed)
    (bundle / "modules" / "backbone" / "variants" / "320x240.mlir").rename(
        bundle / "modules" / "backbone" / "320x240.mlir"
    )
    assert digester.digest(bundle) not in (before, changed, added)


def test_a_deleted_file_changes_the_digest(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    (bundle / "model.py").unlink()
    without = digester.digest(bundle)
    assert without != before
    (bundle / "model.py").write_text("def preprocess(x):\n    return x\n")
    assert digester.digest(bundle) == before


def test_a_renamed_bundle_keeps_its_digest_and_identity(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, "m-staging")
    digester = BundleDigester()
    before = digester.digest(bundle)
    identity = dir_identity(bundle)
    moved = tmp_path / "m-production"
    os.rename(bundle, moved)
    assert dir_identity(moved) == identity
    assert digester.digest(moved) == before
    with pytest.raises(FileNotFoundError):
        digester.digest(bundle)


def test_a_copy_has_the_same_digest_but_another_identity(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)  # copy2 preserves mtimes
    digester = BundleDigester()
    assert digester.digest(copy) == digester.digest(bundle)
    assert dir_identity(copy) != dir_identity(bundle)
    assert dir_identity(bundle) == dir_identity(bundle)


def test_a_vanished_bundle_raises_oserror(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    digester.digest(bundle)
    shutil.rmtree(bundle)
    with pytest.raises(FileNotFoundError):
        digester.digest(bundle)
    with pytest.raises(FileNotFoundError):
        dir_identity(bundle)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(NotADirectoryError):
        digester.digest(not_a_dir)


def test_symlinked_files_are_followed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    blob = store / "weights.bin"
    blob.write_bytes(b"w1")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "manifest.yaml").write_text("m")
    (linked / "weights.safetensors").symlink_to(blob)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.yaml").write_text("m")
    (plain / "weights.safetensors").write_bytes(b"w1")
    digester = BundleDigester()
    before = digester.digest(linked)
    assert before == digester.digest(plain)
    blob.write_bytes(b"w2")
    assert digester.digest(linked) != before


def test_dangling_links_are_skipped_and_directory_loops_end(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    digester = BundleDigester()
    before = digester.digest(bundle)
    (bundle / "gone.bin").symlink_to(tmp_path / "nowhere")
    (bundle / "modules" / "loop").symlink_to(bundle / "modules")
    assert digester.digest(bundle) == before


def test_symlinked_directories_are_followed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "model.b1.mlir").write_text("module {}\n")
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "modules").symlink_to(shared, target_is_directory=True)
    digester = BundleDigester()
    before = digester.digest(bundle)
    (shared / "model.b1.mlir").write_text("module @changed {}\n")
    assert digester.digest(bundle) != before


def test_forget_drops_the_cached_fingerprints(tmp_path: Path) -> None:
    first = _bundle(tmp_path, "first")
    second = _bundle(tmp_path, "second")
    digester = BundleDigester()
    digester.digest(first)
    digester.digest(second)
    assert digester.hashed_files == 12
    digester.forget(first)
    digester.forget(tmp_path / "never-seen")
    digester.digest(first)
    digester.digest(second)
    assert digester.hashed_files == 18
    digester.forget(tmp_path)  # everything below
    digester.digest(second)
    assert digester.hashed_files == 24
