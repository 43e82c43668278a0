import pytest

from rosetta_common.io import atomic_path, read_json, write_json


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_replaces_folders_and_files(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1})
    write_json(tmp_path / "a.json", {"x": 2})
    assert read_json(tmp_path / "a.json") == {"x": 2}
    for value in ("one", "two"):
        with atomic_path(tmp_path / "dir") as tmp:
            tmp.mkdir()
            (tmp / "f").write_text(value)
    assert (tmp_path / "dir" / "f").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "dir"]
