"""Tokenisation, caching, annotation readers and the four task families on the real IGLUE files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers_tasks import IGLUE, bert_uncased_dir, make_store, need_iglue, read_jsonl, xlmr_dir
from volta_ml.data import AnnotationError, TokenCache, encode_texts, load_tokenizer, read_jsonl as read_rows
from volta_ml.tasks import family_for, gqa, nlvr2, retrieval, visual_entailment
from volta_ml.features import MissingImageError


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return load_tokenizer(str(bert_uncased_dir(tmp_path_factory.mktemp("tok"))), do_lower_case=True)


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    need_iglue()
    texts = [r["caption"] for r in read_jsonl(IGLUE / "marvl/zero_shot/annotations/marvl-id.jsonl")]
    texts += [r["sentence2"] for r in read_jsonl(IGLUE / "XVNLI/annotations/fr/test.jsonl")]
    return load_tokenizer(str(xlmr_dir(tmp_path_factory.mktemp("xtok"), texts)))


def view_of(store, add_global="first", max_region_num=36, num_locs=5):
    from volta_ml.features import RegionView, open_store
    return RegionView(open_store(store), num_locs, add_global, max_region_num)


# ---- tokenisation --------------------------------------------------------------------------------------

def test_truncation_keeps_first_and_last_special_tokens(bert, xlmr):
    text = " ".join(["word"] * 50)
    ids, lengths = encode_texts(bert, [text, "a dog"], 12)
    assert ids.shape == (2, 12) and lengths.tolist() == [12, 4]
    assert ids[0, 0] == bert.cls_token_id and ids[0, -1] == bert.sep_token_id
    assert (ids[0, 1:-1] == bert.convert_tokens_to_ids("word")).all()
    assert ids[1, 4:].tolist() == [0] * 8  # BERT pads with 0 at the end
    xids, xlengths = encode_texts(xlmr, [text, "foto"], 10)
    assert xids[0, 0] == 0 and xids[0, -1] == 2  # <s> ... </s>
    assert xids[1, xlengths[1]:].tolist() == [1] * (10 - xlengths[1])  # XLM-R pads with 1


def test_do_lower_case_is_passed_explicitly(tmp_path):
    folder = str(bert_uncased_dir(tmp_path))
    lowered = load_tokenizer(folder, do_lower_case=True).encode("Dog")
    cased = load_tokenizer(folder, do_lower_case=False).encode("Dog")
    assert lowered[1] != cased[1] and cased[1] == 100  # without the flag "Dog" is [UNK], as IGLUE-VOLTA


def test_tokenizer_is_never_downloaded(tmp_path):
    with pytest.raises(Exception, match="never downloads|not a local directory|cannot load"):
        load_tokenizer("surely-not-a-cached-model-xyz")


def test_token_cache_is_keyed_by_content(tmp_path, bert):
    data = tmp_path / "data.jsonl"
    data.write_text('{"a": 1}\n')
    cache = TokenCache(tmp_path / "cache")
    first = cache.encode(bert, ["a red car"], 8, source=data)
    files = list((tmp_path / "cache").glob("*.npz"))
    assert len(files) == 1 and np.array_equal(first[0], encode_texts(bert, ["a red car"], 8)[0])
    again = cache.encode(bert, ["a red car"], 8, source=data)
    assert np.array_equal(first[0], again[0]) and len(list((tmp_path / "cache").glob("*.npz"))) == 1
    data.write_text('{"a": 2}\n')  # same split name in VOLTA would reuse the stale pickle
    cache.encode(bert, ["a red car"], 8, source=data)
    cache.encode(bert, ["a red car"], 9, source=data)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3
    assert not list(tmp_path.glob("*.pkl")) and not (tmp_path / "cache" / "cache").exists()


def test_malformed_jsonl_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"gold_label": "neutral"}\n{"gold_label": \n')
    with pytest.raises(AnnotationError, match=r"bad.jsonl:2: not valid JSON"):
        read_rows(bad)
    missing_field = tmp_path / "ve.jsonl"
    missing_field.write_text('{"gold_label": "neutral", "sentence2": "x"}\n')
    with pytest.raises(AnnotationError, match=r"ve.jsonl:1: missing field 'Flikr30kID'"):
        visual_entailment.read_examples(str(missing_field))


# ---- families on the real annotation files ---------------------------------------------------------

def test_xvnli_dataset_matches_annotations(tmp_path, bert):
    path = need_iglue() / "XVNLI/annotations/ar/test.jsonl"
    rows = read_jsonl(path)
    store = make_store(tmp_path / "flickr.lmdb", [int(r["Flikr30kID"]) for r in rows], boxes_range=(36, 36))
    entry = {"name": "XVNLI", "type": "VL-tri-classifier", "max_seq_length": 80, "max_region_num": 36}
    view = view_of(store)
    dataset = visual_entailment.build_dataset(entry, "test", bert, view, annotation_path=str(path))
    assert len(dataset) == len(rows) == 1164
    labels = {"contradiction": 0, "neutral": 1, "entailment": 2}
    dash = 0
    for index in (0, 1, 500, 1163):
        item = dataset[index]
        gold = rows[index]["gold_label"]
        expected = np.zeros(3, np.float32)
        if gold in labels:
            expected[labels[gold]] = 1
        assert np.array_equal(item["target"], expected)
    for index, row in enumerate(rows):
        if row["gold_label"] == "-":
            dash += 1
            assert not dataset[index]["target"].any()
    assert dash == 14
    item = dataset[0]
    # VE quirk: 36 rows with the global feature first, so the 36th detector box is dropped
    assert item["input_imgs"].shape == (36, 16) and item["image_attention_mask"].sum() == 36
    full = view[str(int(rows[0]["Flikr30kID"]))]
    assert np.allclose(item["input_imgs"], np.asarray(full.features)[:36])
    assert item["input_txt"][0] == bert.cls_token_id


def test_xgqa_dataset_from_gqa_json(tmp_path, xlmr):
    root = need_iglue()
    path = root / "xGQA/annotations/few_shot/de/train_5.json"
    questions = json.loads(path.read_text(encoding="utf-8"))
    store = make_store(tmp_path / "gqa.lmdb", [q["imageId"] for q in questions.values()])
    entry = {"name": "GQA", "type": "VL-classifier-GQA", "num_labels": 1842, "max_seq_length": 40,
             "max_region_num": 36, "dataroot": str(root / "gqa/annotations")}
    dataset = gqa.build_dataset(entry, "test_de", xlmr, view_of(store), annotation_path=str(path))
    assert len(dataset) == len(questions) == 155
    ans2label = json.loads((root / "gqa/annotations/trainval_ans2label.json").read_text())
    for index, (qid, question) in enumerate(list(questions.items())[:20]):
        item = dataset[index]
        assert item["question_id"] == int(qid)
        assert item["target"].shape == (1842,)
        assert item["target"][ans2label[question["answer"]]] == 1.0 and item["target"].sum() == 1.0
        assert item["input_imgs"].shape == (37, 16)  # 36 + global


def test_marvl_dataset_pairs_two_images(tmp_path, xlmr):
    path = need_iglue() / "marvl/zero_shot/annotations/marvl-id.jsonl"
    rows = read_jsonl(path)
    ids = [r[k].split(".")[0] for r in rows for k in ("left_img", "right_img")]
    store = make_store(tmp_path / "marvl.lmdb", ids)
    entry = {"name": "NLVR2", "type": "VL-binary-classifier", "max_seq_length": 80, "max_region_num": 36}
    view = view_of(store)
    dataset = nlvr2.build_dataset(entry, "test", xlmr, view, annotation_path=str(path))
    assert len(dataset) == 1128
    item = dataset[3]
    assert item["input_imgs"].shape == (74, 16)
    assert np.allclose(item["input_imgs"][:37], np.asarray(view[rows[3]["left_img"].split(".")[0]].features))
    assert np.allclose(item["input_imgs"][37:], np.asarray(view[rows[3]["right_img"].split(".")[0]].features))
    assert [dataset[i]["target"].argmax() for i in range(30)] == [int(r["label"]) for r in rows[:30]]


def test_nlvr2_labels_and_image_ids(tmp_path, bert):
    path = need_iglue() / "nlvr2/annotations/dev.jsonl"
    records = nlvr2.read_examples(str(path))
    assert records[0]["images"] == ("dev-850-0-img0", "dev-850-0-img1")
    rows = read_jsonl(path)
    assert [r["label"] for r in records] == [0 if row["label"] == "False" else 1 for row in rows]


def test_missing_image_names_id_store_and_line(tmp_path, bert):
    path = need_iglue() / "XVNLI/annotations/fr/test.jsonl"
    rows = read_jsonl(path)
    ids = [int(r["Flikr30kID"]) for r in rows]
    store = make_store(tmp_path / "partial.lmdb", [i for i in ids if i != ids[4]])
    entry = {"name": "XVNLI", "type": "VL-tri-classifier", "max_seq_length": 80, "max_region_num": 36}
    with pytest.raises(MissingImageError, match=rf"image id '{ids[4]}' \(annotation line 5\)") as err:
        visual_entailment.build_dataset(entry, "test", bert, view_of(store), annotation_path=str(path))
    assert "partial.lmdb" in str(err.value)


def test_retrieval_keys_follow_the_store(tmp_path, xlmr):
    root = need_iglue()
    xflickr = root / "xFlickrCO/annotations/de/test.jsonl"
    rows = read_jsonl(xflickr)
    store = make_store(tmp_path / "xf.lmdb", [r["img_path"] for r in rows])  # test LMDB keys = file names
    images, captions = retrieval.read_captions(str(xflickr), view_of(store))
    assert len(images) == len(captions) == 2000 and images[1500].startswith("COCO_val2014_")
    flickr = root / "flickr30k/annotations/valid_ann.jsonl"
    frows = read_jsonl(flickr)
    fstore = make_store(tmp_path / "f30k.lmdb", [str(int(r["img_path"].split(".")[0])) for r in frows])
    images, captions = retrieval.read_captions(str(flickr), view_of(fstore))
    assert len(images) == 1000 and len(captions) == sum(len(r["sentences"]) for r in frows)
    wit = root / "wit/annotations/test_en.jsonl"
    wrows = read_jsonl(wit)
    wstore = make_store(tmp_path / "wit.lmdb", [r["wit_ix"] for r in wrows])
    images, captions = retrieval.read_captions(str(wit), view_of(wstore))
    assert len(captions) == 1000 and len(images) == len({r["wit_ix"] for r in wrows})


def test_retrieval_four_way_items_are_reproducible(tmp_path, bert):
    path = need_iglue() / "xFlickrCO/annotations/de/train_10.jsonl"
    rows = read_jsonl(path)
    store = make_store(tmp_path / "few.lmdb", [str(int(r["img_path"].split(".")[0])) for r in rows])
    entry = {"name": "RetrievalFlickr30k", "type": "VL-logit", "max_seq_length": 20, "max_region_num": 36}
    dataset = retrieval.build_dataset(entry, "train_de_10", bert, view_of(store), annotation_path=str(path))
    item = dataset[2]
    assert item["input_imgs"].shape == (4, 37, 16) and item["input_txt"].shape == (4, 20)
    assert np.array_equal(item["input_txt"][0], item["input_txt"][2])       # options 1 and 3 share the caption
    assert np.array_equal(item["input_imgs"][0], item["input_imgs"][1])     # options 1, 2, 4 share the image
    assert not np.array_equal(item["input_imgs"][0], item["input_imgs"][2])
    assert not np.array_equal(item["input_txt"][0], item["input_txt"][1])
    again = dataset[2]
    assert all(np.array_equal(item[k], again[k]) for k in ("input_txt", "input_imgs"))
    epoch0 = [dataset[i]["input_txt"] for i in range(len(dataset))]
    dataset.set_epoch(1)  # fresh negatives each epoch
    assert any(not np.array_equal(dataset[i]["input_txt"], epoch0[i]) for i in range(len(dataset)))
    with pytest.raises(FileNotFoundError, match="hard_negative.pkl"):
        retrieval.build_dataset(dict(entry, dataroot=str(tmp_path)), "train", bert, dataset.region_view,
                                annotation_path=str(path))


def test_retrieval_gallery_chunks(tmp_path, bert):
    path = need_iglue() / "xFlickrCO/annotations/de/train_5.jsonl"
    rows = read_jsonl(path)
    store = make_store(tmp_path / "g.lmdb", [r["img_path"] for r in rows])
    entry = {"name": "RetrievalxFlickrCO", "type": "VL-logit", "max_seq_length": 20, "max_region_num": 36}
    gallery = retrieval.build_gallery(entry, bert, view_of(store), str(path), num_subiters=2)
    assert len(gallery) == 10  # 5 captions x 2 chunks
    first, second = gallery[2], gallery[3]  # caption 1, chunks 0 and 1 (sizes 3 and 2)
    assert first["input_imgs"].shape[0] == 3 and second["input_imgs"].shape[0] == 2
    assert first["target"].tolist() == [0, 1, 0] and second["target"].tolist() == [0, 0]


def test_family_selection():
    assert family_for({"type": "VL-tri-classifier", "name": "XVNLI"}) is visual_entailment
    assert family_for({"type": "VL-logit", "name": "RetrievalWIT"}) is retrieval
    with pytest.raises(Exception, match="not supported"):
        family_for({"type": "V-logit", "name": "refcoco"})


def test_retrieval_hard_negatives_for_the_train_split(tmp_path, bert):
    import pickle

    path = need_iglue() / "xFlickrCO/annotations/de/train_10.jsonl"
    rows = read_jsonl(path)
    names = [str(int(r["img_path"].split(".")[0])) for r in rows]
    store = make_store(tmp_path / "train.lmdb", names)
    pool = np.zeros((len(names), 100))
    pool[:, 1:] = 7  # every image's nearest neighbours: image 7
    pool[7, 1:] = 3
    with open(tmp_path / "hard_negative.pkl", "wb") as handle:
        pickle.dump({"train_image_list": names, "train_hard_pool": pool}, handle)
    entry = {"name": "RetrievalFlickr30k", "type": "VL-logit", "max_seq_length": 24, "max_region_num": 36,
             "dataroot": str(tmp_path)}
    dataset = retrieval.build_dataset(entry, "train", bert, view_of(store), annotation_path=str(path))
    for index in (0, 5, 7):
        hard_image = 3 if index == 7 else 7
        expected = encode_texts(bert, [rows[hard_image]["sentences"][0]], 24)[0][0]
        assert np.array_equal(dataset[index]["input_txt"][3], expected)


def test_retrieval_single_image_uses_mask_text_and_store_images(tmp_path, bert):
    path = need_iglue() / "xFlickrCO/annotations/de/train_1.jsonl"
    row = read_jsonl(path)[0]
    own = str(int(row["img_path"].split(".")[0]))
    store = make_store(tmp_path / "one.lmdb", [own, "111", "222"])
    entry = {"name": "RetrievalFlickr30k", "type": "VL-logit", "max_seq_length": 16, "max_region_num": 36}
    view = view_of(store)
    dataset = retrieval.build_dataset(entry, "train_de_1", bert, view, annotation_path=str(path))
    item = dataset[0]
    mask = encode_texts(bert, ["[MASK]"], 16)[0][0]
    assert np.array_equal(item["input_txt"][1], mask) and np.array_equal(item["input_txt"][3], mask)
    others = [np.asarray(view[k].features) for k in ("111", "222")]
    assert any(np.array_equal(item["input_imgs"][2], o) for o in others)
