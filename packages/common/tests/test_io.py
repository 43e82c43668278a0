import pytest

from rosetta_common.io import atomic_path, read_json, sha256, staged_outputs, write_json


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


def test_temporaries_live_in_the_repositorys_scratch_folder_not_beside_outputs(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    target = tmp_path / "artifacts" / "mlp" / "torch"
    with staged_outputs(target) as staged:
        (staged / "a.txt").write_text("new")
        # While the stage works, nothing appears under artifacts/: a later stage (or DVC) sees no partial output.
        assert not (tmp_path / "artifacts" / "mlp").exists() or list((tmp_path / "artifacts" / "mlp").iterdir()) == []
        assert staged.is_relative_to(tmp_path / ".rosetta" / "tmp")
    assert (target / "a.txt").read_text() == "new"
    with pytest.raises(RuntimeError), staged_outputs(target) as staged:
        (staged / "b.txt").write_text("half")
        raise RuntimeError("killed halfway")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]  # the previous outputs, untouched
    assert list((tmp_path / ".rosetta" / "tmp").iterdir()) == []


def test_sha256_of_a_file(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
