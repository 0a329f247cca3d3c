"""Retrieval metrics on hand-built score matrices: ties, several gold captions per image, VOLTA's lines."""
import re

import numpy as np
import pytest

from volta_ml.tasks.retrieval_metrics import (
    final_line, image_retrieval_ranks, read_final_lines, recall_metrics, running_ir_lines, text_retrieval_ranks,
    top_images,
)

# 5 captions x 3 images; image 0 has captions 0 and 1, image 1 caption 2, image 2 captions 3 and 4.
SCORES = np.array([
    [0.9, 0.5, 0.1],
    [0.4, 0.4, 0.7],   # gold 0 tied with image 1 (after it): only 0.7 is ahead -> rank 1
    [0.6, 0.6, 0.2],   # gold 1 tied with image 0 (before it) -> rank 1
    [0.3, 0.8, 0.8],   # gold 2 tied with image 1 -> rank 1
    [0.1, 0.2, 0.3],
], dtype=np.float32)
CAPTION_IMAGE = np.array([0, 0, 1, 2, 2])


def test_image_retrieval_first_gold_with_ties():
    ranks = image_retrieval_ranks(SCORES, CAPTION_IMAGE)
    assert ranks.tolist() == [0, 1, 1, 1, 0]
    m = recall_metrics(ranks)
    assert m == {"r1": 40.0, "r5": 100.0, "r10": 100.0, "medr": 2.0, "meanr": pytest.approx(1.6)}


def test_text_retrieval_takes_best_gold_caption():
    ranks = text_retrieval_ranks(SCORES, CAPTION_IMAGE)
    # image 0: captions 0 (rank 0) and 1 (rank 2) -> 0; image 1: caption 2 behind caption 3 -> 1;
    # image 2: caption 3 first (rank 0), caption 4 third -> 0
    assert ranks.tolist() == [0, 1, 0]
    m = recall_metrics(ranks)
    assert m["r1"] == pytest.approx(200 / 3) and m["medr"] == 1.0 and m["meanr"] == pytest.approx(4 / 3)


def test_median_convention_even_count():
    assert recall_metrics(np.array([0, 1, 2, 5]))["medr"] == 2.0   # floor(1.5 + 1)
    assert recall_metrics(np.array([3, 3, 4, 9]))["medr"] == 4.0   # floor(3.5 + 1)


def reference_ranks(scores, caption_image):
    """Brute force with an explicit stable descending argsort."""
    ir = [int(np.where(np.argsort(-row, kind="stable") == g)[0][0]) for row, g in zip(scores, caption_image)]
    tr = []
    for image in range(scores.shape[1]):
        order = np.argsort(-scores[:, image], kind="stable")
        tr.append(min(int(np.where(order == c)[0][0]) for c in np.where(caption_image == image)[0]))
    return ir, tr


def test_random_matrices_with_many_ties_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(5):
        n_img = int(rng.integers(3, 30))
        caption_image = np.concatenate([np.arange(n_img), rng.integers(0, n_img, int(rng.integers(0, 40)))])
        scores = rng.integers(0, 4, (len(caption_image), n_img)).astype(np.float32)  # coarse: ties everywhere
        ir, tr = reference_ranks(scores, caption_image)
        assert image_retrieval_ranks(scores, caption_image, block=7).tolist() == ir
        assert text_retrieval_ranks(scores, caption_image).tolist() == tr
        top = top_images(scores, k=20, block=5)
        assert top == [np.argsort(-row, kind="stable")[:20].tolist() for row in scores]


def test_running_lines_end_with_the_final_figures():
    ranks = np.array([4, 0, 12, 1, 1, 0, 30, 2])
    lines = list(running_ir_lines(ranks, num_subiters=2))
    assert len(lines) == len(ranks)
    for count, line in enumerate(lines, start=1):
        index, rest = line.split(" ", 1)
        assert int(index) == 2 * count - 1
        assert rest == final_line(recall_metrics(ranks[:count]))


def test_lines_parse_with_igLUE_reading_rule():
    ir, tr = recall_metrics(np.array([0, 3, 12])), recall_metrics(np.array([1, 0]))
    text = "\n".join(["0 " + final_line(ir), "*" * 50, "Image Retrieval", final_line(ir),
                      "*" * 50, "Text Retrieval", final_line(tr), ""])
    assert final_line(ir) == "Final r1:33.333, r5:66.667, r10:66.667, mder:4.000, meanr:6.000"
    got_ir, got_tr = read_final_lines(text)
    assert got_ir == {k: round(v, 3) for k, v in ir.items()}
    assert got_tr == {k: round(v, 3) for k, v in tr.items()}
    # the authors' scrapers split on ':' and ','; the label stays VOLTA's 'mder'
    assert re.findall(r"mder:", text) and "medr" not in text


def test_recall_is_computed_as_iglue_does():
    """IGLUE's `100 * hits / n`: 23 of 40 under rank 10 is 57.5, not 100 * mean = 57.49999999999999."""
    ranks = np.array([0] * 23 + [50] * 17)
    metrics = recall_metrics(ranks)
    assert metrics["r10"] == 57.5 and metrics["r1"] == 57.5
    assert metrics["r10"] == 100 * 23 / 40 and 100 * np.mean(ranks < 10) != 57.5
