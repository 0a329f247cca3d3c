"""Every real config builds the exact state dict VOLTA's checkpoints have (keys, shapes, aliases)."""
import re

import pytest
import torch

from volta_ml.models import available_configs, build_model, load_config

from conftest import SHARED, shared_path

IGLUE_HEADS = {
    "TASK19": {"type": "VL-tri-classifier", "num_labels": 3},
    "TASK15": {"type": "VL-classifier-GQA", "num_labels": 1842},
    "TASK12": {"type": "VL-binary-classifier", "num_labels": 2},
    "TASK8": {"type": "VL-logit", "num_labels": 1},
}
SECTION = re.compile(r"^## (\S+) / (\S+)\s+\((\d+) keys\)")


def reference_sections():
    sections, current = {}, None
    for line in shared_path("specs", "state_dict_keys_real_configs.txt").read_text().splitlines():
        m = SECTION.match(line)
        if m:
            current = sections.setdefault((m.group(1), m.group(2)), [])
        elif line.strip() and current is not None:
            key, shape = line.split("\t")[:2]
            current.append((key, tuple(int(x) for x in re.findall(r"\d+", shape.split("]")[0]))))
    return sections


def our_keys(name: str, model_class: str):
    kind = "pretraining" if model_class == "BertForVLPreTraining" else "tasks"
    config = load_config(name)
    with torch.device("meta"):
        model = build_model(config, IGLUE_HEADS, list(IGLUE_HEADS), kind=kind)
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


# shipped configs the reference key list does not name -> the listed config with the same architecture
# (ctrl_lxmert_base is ctrl_lxmert without the tokenizer keys bert_model / do_lower_case)
SAME_ARCHITECTURE = {"ctrl_lxmert_base": "ctrl_lxmert"}


def test_every_shipped_config_is_covered():
    """Every shipped config builds VOLTA's keys: its own reference sections, or its twin's."""
    sections = reference_sections()
    listed = {name for name, _ in sections}
    assert listed <= set(available_configs()), "the reference names a config that is not shipped"
    for name in available_configs():
        reference = name if name in listed else SAME_ARCHITECTURE.get(name)
        assert reference in listed, f"{name} is shipped but neither it nor a twin is in the reference key list"
        if reference != name:
            for section in [s for s in sections if s[0] == reference]:
                assert our_keys(name, section[1]) == sections[section], f"{name} vs {section}"


KEYS_FILE = SHARED / "specs" / "state_dict_keys_real_configs.txt"


_NO_KEYS = pytest.param(None, marks=pytest.mark.skip(reason=f"reference material {KEYS_FILE} not available "
                                                            f"(../shared is beside the checkout in CI only)"),
                        id="no-reference-keys")


@pytest.mark.parametrize("section", [pytest.param(s, id=f"{s[0]}-{s[1]}") for s in sorted(reference_sections())]
                         if KEYS_FILE.exists() else [_NO_KEYS])
def test_state_dict_matches_volta(section):
    expected = reference_sections()[section]
    got = our_keys(*section)
    assert dict(got) == dict(expected)
    assert [k for k, _ in got] == [k for k, _ in expected], "key order differs from VOLTA's"
