"""Converted SeqBERT folders work in the matching `transformers.pipeline` tasks and give BERT's answers.

transformers 5 removed the "question-answering" pipeline and never had one for multiple choice: those heads are
covered by the logit parity tests in test_bert_parity.py."""

import pytest
import torch
from convert_bert_checkpoint import ConversionArguments, convert, main  # noqa: E402
from transformers import pipeline

import seqbert


TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def converted(bert_checkpoints, tmp_path_factory):
    """Each BERT checkpoint converted with scripts/hub/convert_bert_checkpoint.py. Returns BERT class name -> folder."""
    out = {}
    for name, folder in bert_checkpoints.items():
        target = tmp_path_factory.mktemp("seqbert") / name
        convert(ConversionArguments(bert_model_name_or_path=str(folder), output_dir=str(target)))
        out[name] = target
    return out


def test_conversion_picks_the_class_that_keeps_the_head(converted):
    from transformers import AutoConfig

    expected = {
        "BertForMaskedLM": "SeqBertForMaskedLM",
        "BertForPreTraining": "SeqBertForMaskedLM",
        "BertForSequenceClassification": "SeqBertForSequenceClassification",
        "BertForTokenClassification": "SeqBertForTokenClassification",
        "BertForQuestionAnswering": "SeqBertForQuestionAnswering",
    }
    for name, folder in converted.items():
        config = AutoConfig.from_pretrained(folder)
        assert config.model_type == "seqbert" and config.architectures == [expected[name]]
        assert (folder / "tokenizer.json").exists() and (folder / "model.safetensors").exists()


def test_convert_script_refuses_to_overwrite(bert_checkpoints, tmp_path):
    target = tmp_path / "exists"
    target.mkdir()
    with pytest.raises(ValueError, match="already exists"):
        main(["--bert_model_name_or_path", str(bert_checkpoints["BertForMaskedLM"]), "--output_dir", str(target)])


def test_convert_script_on_the_real_minilm_checkpoint(minilm_path, tmp_path):
    main(["--bert_model_name_or_path", str(minilm_path), "--output_dir", str(tmp_path / "minilm")])
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tmp_path / "minilm")
    assert type(model) is seqbert.SeqBertModel and model.config.num_hidden_layers == 6


def test_fill_mask(converted, bert_checkpoints):
    text = "the movie was a [MASK] of time ."
    ours = pipeline("fill-mask", model=str(converted["BertForMaskedLM"]), top_k=5)(text)
    theirs = pipeline("fill-mask", model=str(bert_checkpoints["BertForMaskedLM"]), top_k=5)(text)
    assert type(pipeline("fill-mask", model=str(converted["BertForMaskedLM"])).model) is seqbert.SeqBertForMaskedLM
    assert [r["token"] for r in ours] == [r["token"] for r in theirs]
    assert all(abs(a["score"] - b["score"]) <= TOLERANCE for a, b in zip(ours, theirs, strict=True))


def test_text_classification(converted, bert_checkpoints, rt_texts):
    texts = rt_texts[:8]
    ours = pipeline("text-classification", model=str(converted["BertForSequenceClassification"]), top_k=None)(texts)
    theirs = pipeline("text-classification", model=str(bert_checkpoints["BertForSequenceClassification"]), top_k=None)(
        texts
    )
    for a, b in zip(ours, theirs, strict=True):
        a, b = sorted(a, key=lambda r: r["label"]), sorted(b, key=lambda r: r["label"])
        assert [r["label"] for r in a] == [r["label"] for r in b]
        assert all(abs(x["score"] - y["score"]) <= TOLERANCE for x, y in zip(a, b, strict=True))


def test_token_classification(converted, bert_checkpoints, rt_texts):
    ours = pipeline("token-classification", model=str(converted["BertForTokenClassification"]))(rt_texts[0])
    theirs = pipeline("token-classification", model=str(bert_checkpoints["BertForTokenClassification"]))(rt_texts[0])
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        assert (a["word"], a["entity"], a["start"]) == (b["word"], b["entity"], b["start"])
        assert abs(a["score"] - b["score"]) <= TOLERANCE


def test_feature_extraction(minilm_path, tmp_path, rt_texts):
    main(["--bert_model_name_or_path", str(minilm_path), "--output_dir", str(tmp_path / "minilm")])
    ours = pipeline("feature-extraction", model=str(tmp_path / "minilm"))(rt_texts[0], return_tensors=True)
    theirs = pipeline("feature-extraction", model=str(minilm_path))(rt_texts[0], return_tensors=True)
    assert (torch.as_tensor(ours) - torch.as_tensor(theirs)).abs().max().item() <= TOLERANCE
