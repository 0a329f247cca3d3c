"""The released files as the hub holds them: the dataset card's `configs` naming each split's files (xMMMU's
`translated_MMMU_val_300_with_image_<Language>.parquet`), MTVQA's Korean as `KR`, and PangeaBench's parquet
copies of MaXM, XM100 and M3Exam giving the same per-item scores as the original releases (tests/helpers_suite.py,
tests/helpers_suite_copies.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_fake_backends import FakeGenerative
from helpers_suite import XMMMU_FILES, build_suite
from helpers_suite_copies import (write_iglue_copies, write_iglue_originals, write_m3exam_copy, write_maxm_copy,
                                  write_mtvqa_kr, write_xm100_copy, write_xm3600_copy)
from test_suite import backend_for, options
from volta_ml.iglue_hf.parquet import ReleaseError, card_splits, parquet_shards
from volta_ml.suite.data import SuiteDataError
from volta_ml.suite.run import run_suite
from volta_ml.suite.table import TASKS


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite_copies")
    built = build_suite(root)
    images = built["xm3600"]["images"]
    built["copies"] = {"maxm": write_maxm_copy(root, built["maxm"], images),
                       "xm100": write_xm100_copy(root, images),
                       "m3exam": write_m3exam_copy(root, built["m3exam"]),
                       "xm3600": write_xm3600_copy(root, images)}
    return built


def test_xmmmu_languages_are_found_through_the_dataset_card(suite, tmp_path):
    """`--lang ja` reads data/translated_MMMU_val_300_with_image_Japanese.parquet, `en` the validation file: the
    card's configs name them; without the card these names are no split (the error the issue reported)."""
    root = Path(suite["xmmmu"])
    for lang in ("ja", "en"):
        data = TASKS["xmmmu"].reader(root, lang, {})
        assert data.files == [root / XMMMU_FILES[lang]]
        assert {item.lang for item in data.items} == {lang} and len(data.items) == 4
    assert sorted(card_splits(root)) == sorted(XMMMU_FILES)
    result = run_suite(options(suite, "xmmmu", "ja", tmp_path / "ja", rule="letter"), backend=backend_for("xmmmu"))
    assert result["n_items"] == 4 and result["data_files"] == [str(root / XMMMU_FILES["ja"])]
    bare = tmp_path / "bare"
    (bare / "data").mkdir(parents=True)
    for lang in ("ja", "en"):
        (bare / XMMMU_FILES[lang]).write_bytes((root / XMMMU_FILES[lang]).read_bytes())
    with pytest.raises(ReleaseError, match="no parquet shard of split 'ja'"):
        parquet_shards(bare, "ja")
    assert parquet_shards(bare, "translated_MMMU_val_300_with_image_Japanese") == [bare / XMMMU_FILES["ja"]]
    with pytest.raises(ReleaseError, match=r"README.md: the dataset card's configs have no split 'de'; its splits: en"):
        parquet_shards(root, "de")


def test_card_forms_the_hub_accepts(tmp_path):
    """data_files as a bare pattern (split train), a list of paths, glob patterns; a front matter without configs
    falls back to the file names; a split two configs give other files, a broken front matter, a pattern matching
    nothing: one line naming the card."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "ds"
    for name in ("data/a-0.parquet", "data/a-1.parquet", "other/b.parquet", "test-00000-of-00001.parquet"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": [1]}), root / name)
    readme = root / "README.md"
    readme.write_text("---\nconfigs:\n- config_name: default\n  data_files: data/a-*\n---\n")
    assert parquet_shards(root, "train") == [root / "data/a-0.parquet", root / "data/a-1.parquet"]
    readme.write_text("---\nconfigs:\n- config_name: x\n  data_files:\n  - split: test\n    path:\n"
                      "    - other/b.parquet\n    - data/a-1.parquet\n---\n")
    assert parquet_shards(root, "test") == [root / "data/a-1.parquet", root / "other/b.parquet"]
    readme.write_text("---\nlicense: mit\n---\n# no configs\n")
    assert parquet_shards(root, "test") == [root / "test-00000-of-00001.parquet"]
    bad = [("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: test\n    path: data/a-0.parquet\n"
            "- config_name: b\n  data_files:\n  - split: test\n    path: other/b.parquet\n---\n",
            r"split 'test' is given other files by configs 'a' and 'b'"),
           ("---\nconfigs: [\n---\n", r"README.md: the front matter is not YAML"),
           ("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: test\n    path: nowhere/*.parquet\n---\n",
            r"no parquet file matches the data_files \['nowhere/\*.parquet'\] the dataset card \(README.md\) gives "
            r"split 'test'"),
           ("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: test\n---\n", r"configs\[0\] \(a\): data_files "
                                                                                   r"entry .* has no path")]
    for text, pattern in bad:
        readme.write_text(text)
        with pytest.raises(ReleaseError, match=pattern):
            parquet_shards(root, "test")


def test_mtvqa_korean_as_kr_and_other_languages_never_stop_a_run(tmp_path):
    root = write_mtvqa_kr(tmp_path)
    read = TASKS["mtvqa"].reader
    assert [(i.id, i.references) for i in read(root, "ko", {}).items] == [("KR_0_0", ("출구",))]
    assert [i.id for i in read(root, "de", {}).items] == ["DE_1_0"]
    with pytest.raises(SuiteDataError, match=r"no MTVQA questions in language 'ja' \(languages found: de, ko, xx\)"):
        read(root, "ja", {})


def _per_item(out: Path, lang: str) -> tuple[list, list]:
    # every field but `cluster`: the image key a copy's parquet cell gives (shard, row, column) is not the original's
    # image file name, so a copy clusters by its own image cells (the same grouping, another name)
    items = [{k: v for k, v in json.loads(line).items() if k != "cluster"}
             for line in (out / f"test_{lang}_items.jsonl").read_text().splitlines()]
    predictions = out / "predictions.jsonl"
    predictions = [json.loads(line) for line in predictions.read_text().splitlines()] if predictions.exists() else []
    assert items
    return sorted(items, key=lambda r: r["id"]), sorted(predictions, key=lambda r: r["id"])


# task, language, rule, the copy read, whether --subset still applies
COPIES = [("maxm", "en", "exact", "maxm", False), ("maxm", "zh", "relaxed", "maxm", False),
          ("xm100", "en", "cider-pyptb", "xm100", False), ("xm100", "de", "cider-pyptb", "xm100", False),
          ("m3exam", "th", "generate", "m3exam", False), ("m3exam", "th", "letter", "m3exam", False),
          ("xm3600", "th", "cider-pyptb", "xm3600", False), ("xm100", "en", "cider-pyptb", "xm3600", True),
          ("xm3600_retrieval", "de", "embedding", "xm3600", False)]


@pytest.mark.parametrize("task,lang,rule,copy,subset", COPIES)
def test_a_copy_scores_each_item_as_the_original(suite, tmp_path, task, lang, rule, copy, subset):
    """The same items from the original release and from a parquet copy on the hub (PangeaBench's MaXM, XM100,
    M3Exam; floschne's XM3600, also restricted by --subset to XM100's keys), scored by fresh contract fakes:
    identical per-item files and predictions (ids, scores, answers, prompts)."""
    original = run_suite(options(suite, task, lang, tmp_path / "original", rule=rule), backend=backend_for(task))
    copy_opts = dict(options(suite, task, lang, tmp_path / "copy", rule=rule), data=str(suite["copies"][copy]),
                     images=None)
    if not subset:
        copy_opts["subset"] = None
    result = run_suite(copy_opts, backend=backend_for(task))
    assert _per_item(tmp_path / "original", lang) == _per_item(tmp_path / "copy", lang)
    assert original["metrics"] == result["metrics"]
    assert result["n_items"] == original["n_items"] > 0
    assert all(f.startswith(str(suite["copies"][copy])) for f in result["data_files"] if not f.endswith(".txt"))


def test_copies_read_natively(suite):
    """MaXM's `<lang>_yesno` split by --split, XM100's captions of one image grouped over rows, M3Exam's base64
    images decoded, its split found by M3Exam's language name; a copy's bad rows are one line."""
    maxm = TASKS["maxm"].reader(suite["copies"]["maxm"], "en", {"split": "en_yesno"})
    assert [i.id for i in maxm.items] == ["en-yesno-0"] and maxm.store.load(maxm.items[0].images[0]).size
    xm = TASKS["xm100"].reader(suite["copies"]["xm100"], "en", {})
    assert [len(i.references) for i in xm.items] == [2, 2, 2] and xm.items[0].references[0].startswith("A red car")
    m3 = TASKS["m3exam"].reader(suite["copies"]["m3exam"], "th", {})
    assert [len(i.images) for i in m3.items] == [1, 1, 2]
    assert all(m3.store.load(k).size for i in m3.items for k in i.images)
    with pytest.raises(SuiteDataError, match=r"the dataset card's configs have no split 'vietnamese'.*M3Exam's vi is "
                                             r"split 'vi' or 'vietnamese'"):
        TASKS["m3exam"].reader(suite["copies"]["m3exam"], "vi", {})


@pytest.fixture(scope="module")
def iglue(tmp_path_factory):
    root = tmp_path_factory.mktemp("iglue_copies")
    originals = write_iglue_originals(root)
    return originals, write_iglue_copies(root, originals)


@pytest.mark.parametrize("task,lang,rule", [("xvnli", "ar", "letter"), ("xvnli", "ar", "generate"),
                                            ("xgqa", "de", "generate"), ("marvl", "id", "letter")])
def test_iglue_copies_score_each_item_as_iglues_files(iglue, tmp_path, task, lang, rule):
    """floschne's copies through `volta-ml iglue-hf` (--annotations the copy's folder, no --images): the same
    per-item scores and predictions as IGLUE's file with its image folder."""
    from volta_ml.iglue_hf.run import run_iglue_hf

    originals, copies = iglue
    annotation, images = originals[task]
    common = {"task": task, "backend": "fake", "model": "/models/fake-model", "lang": lang, "protocol": "zero-shot",
              "progress": False, "batch_size": 3, "chunk_size": 2, "rule": rule}
    original = run_iglue_hf(dict(common, annotations=str(annotation), images=str(images),
                                 output_dir=str(tmp_path / "original")), backend=FakeGenerative(max_images=2))
    copy = run_iglue_hf(dict(common, annotations=str(copies[task]), output_dir=str(tmp_path / "copy")),
                        backend=FakeGenerative(max_images=2))
    assert _per_item(tmp_path / "original", lang) == _per_item(tmp_path / "copy", lang)
    assert original["metrics"] == copy["metrics"] and copy["n_examples"] == original["n_examples"] > 0
    assert copy["image_template"] == "embedded (parquet cells)" and copy["image_root"] == str(copies[task] / "data")


def test_iglue_copies_usage(iglue, tmp_path, capsys):
    """MaRVL's translate-test reads the copy's hypo_en; a copy without translations, a task without a copy, a
    file without --images: one line each."""
    from volta_ml.engine.failures import UsageError
    from volta_ml.iglue_hf.data import read_copy

    originals, copies = iglue
    examples, source = read_copy("marvl", copies["marvl"], "id", translated=True)
    assert [e.text for e in examples] == [f"The pan {k}" for k in range(4)]
    assert [e.label for e in examples] == ["true", "false", "true", "false"]
    assert all(source.load(r).size for e in examples for r in e.images)
    with pytest.raises(UsageError, match="xvnli: the hub copy has no English translations"):
        read_copy("xvnli", copies["xvnli"], "ar", translated=True)
    with pytest.raises(UsageError, match="xflickrco: no hub copy with embedded images is read for this task"):
        read_copy("xflickrco", copies["xvnli"], "ar")
    with pytest.raises(ReleaseError, match="the dataset card's configs have no split 'fr'"):
        read_copy("xvnli", copies["xvnli"], "fr")
    from volta_ml.cli import main
    code = main(["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", "/models/nowhere", "--lang", "ar",
                 "--annotations", str(originals["xvnli"][0]), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("volta-ml iglue-hf: error: give --images (the image root folder); only a hub copy with embedded "
                      "images (a parquet folder or file as --annotations) needs none")
