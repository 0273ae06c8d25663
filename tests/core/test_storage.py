"""core/storage.py's helpers on a local folder: listing and retries (no servers)."""

from __future__ import annotations

import os

import pytest
from mmcurate.core.storage import filesystem, find_files, with_retries


@pytest.fixture
def tree(tmp_path):
    """Nested and hidden folders, a symlinked folder and file, a broken link, an empty folder."""
    root, other = tmp_path / "root", tmp_path / "other"
    for folder in (root / "a" / "b", root / ".hidden", root / "empty", other):
        folder.mkdir(parents=True)
    for path in (root / "x.jpg", root / "a" / "y.jpg", root / "a" / "b" / "z.png"):
        path.write_bytes(b"x")
    (root / ".hidden" / "q.jpg").write_bytes(b"q")
    (other / "o.jpg").write_bytes(b"o")
    os.symlink(other, root / "linked")
    os.symlink(other / "o.jpg", root / "f.jpg")
    os.symlink(tmp_path / "missing", root / "broken.jpg")
    return root


@pytest.mark.parametrize("form", ["{}", "{}/", "file://{}"])
def test_local_listing_is_what_fsspec_find_lists(tree, form):
    """Symlinked folders are listed, not entered (as fsspec does on every backend)."""
    fs, root = filesystem(form.format(tree), {})
    found = sorted(find_files(fs, root))
    assert found == sorted(fs.find(root))
    assert f"{tree}/linked" in found and f"{tree}/broken.jpg" in found
    assert f"{tree}/a/b/z.png" in found and f"{tree}/.hidden/q.jpg" in found


def test_transient_errors_are_retried_and_others_raised_at_once():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("slow")
        return "done"

    assert with_retries(flaky, base_s=0.001) == "done" and len(calls) == 3

    for error in (ValueError("bad"), FileNotFoundError("gone"), PermissionError("no")):
        calls.clear()

        def failing(error=error):
            calls.append(1)
            raise error

        with pytest.raises(type(error)):
            with_retries(failing, base_s=0.001)
        assert len(calls) == 1
    calls.clear()

    def always_os_error():
        calls.append(1)
        raise OSError("io")

    with pytest.raises(OSError):
        with_retries(always_os_error, attempts=4, base_s=0.001)
    assert len(calls) == 4
