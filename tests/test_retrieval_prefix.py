"""The pair-independent prefix API of dual-stream models gives the plain forward's outputs."""
import pytest
import torch

from helpers_tiny import tiny_batch, tiny_config
from volta_ml.models import ConfigError, VLBertModel, build_model
from volta_ml.models.modeling import fuse

pytestmark = pytest.mark.usefixtures("one_thread")

TASKS = {"TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1}}


@pytest.mark.parametrize("family,depth", [("ctrl_vilbert_base", 12), ("ctrl_lxmert_base", 18)])
def test_prefix_then_pairs_equals_forward(family, depth):
    torch.manual_seed(0)
    config = tiny_config(family)
    model = build_model(config, TASKS, ["TASK8"]).eval()
    bert = model.bert
    assert bert.pair_independent_depth == depth
    b = tiny_batch(config, batch=4)
    with torch.no_grad():
        plain = bert(b["input_txt"], b["input_imgs"], b["image_loc"], b["token_type_ids"], b["attention_mask"],
                     b["image_attention_mask"])
        # 2 captions and 3 images scored as all 6 pairs from prefixes computed once each
        t = bert.encode_text_prefix(b["input_txt"][:2], b["token_type_ids"][:2], b["attention_mask"][:2])
        v = bert.encode_image_prefix(b["input_imgs"][:3], b["image_loc"][:3], b["image_attention_mask"][:3])
        ci, ii = torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij")
        ci, ii = ci.flatten(), ii.flatten()
        pairs = bert.encode_pairs(t[ci], v[ii], b["attention_mask"][ci], b["image_attention_mask"][ii])
        reference = bert(b["input_txt"][ci], b["input_imgs"][ii], b["image_loc"][ii], b["token_type_ids"][ci],
                         b["attention_mask"][ci], b["image_attention_mask"][ii])
        logits = model.head("TASK8", pairs, fuse(config, pairs))
        reference_logits = model(b["input_txt"][ci], b["input_imgs"][ii], b["image_loc"][ii], "TASK8",
                                 b["token_type_ids"][ci], b["attention_mask"][ci], b["image_attention_mask"][ii])
    torch.testing.assert_close(pairs.pooled_t, reference.pooled_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pairs.seq_v, reference.seq_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, reference_logits, rtol=1e-5, atol=1e-6)
    # the plain forward gives the same scores: the diagonal pairs (0,0), (1,1) match it
    torch.testing.assert_close(reference.pooled_t[[0, 4]], plain.pooled_t[:2], rtol=1e-5, atol=1e-6)


def test_single_stream_has_no_prefix():
    bert = VLBertModel(tiny_config("ctrl_uniter_base"))
    assert bert.pair_independent_depth == 0
    b = tiny_batch(bert.config)
    with pytest.raises(ConfigError, match="jointly"):
        bert.encode_text_prefix(b["input_txt"])
