"""Loading never fails silently: clear errors for non-BERT checkpoints, shape-incompatible configs, damaged files, a
missing tokenizer in a seq2seq warm start, and BERT conversions that would leave body parameters at their random
initialisation. Tiny BERTs built with transformers' own classes, and the real MiniLM weights."""

import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2Model,
    RobertaConfig,
    RobertaModel,
)
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import seqbert
from seqbert import checkpoint_loading
from seqbert.convert_bert import split_fused_attention


TINY_BERT = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64,
)  # fmt: skip
# Generation ids for seq2seq warm starts from tiny BERTs, which have no tokenizer.
GENERATION_IDS = dict(decoder_start_token_id=1, eos_token_id=2)
# First name parts of the parameters of SeqBERT head models (a base SeqBertModel names them without `seqbert.`).
TOP_LEVEL = ("seqbert.", "decoder.", "lm_head.", "classifier.", "qa_outputs.")
HEAD_CLASSES = [
    seqbert.SeqBertModel,
    seqbert.SeqBertForMaskedLM,
    seqbert.SeqBertForSequenceClassification,
    seqbert.SeqBertForTokenClassification,
    seqbert.SeqBertForQuestionAnswering,
    seqbert.SeqBertForMultipleChoice,
    seqbert.SeqBertForConditionalGeneration,
]


def save_bert(folder, bert_class=BertModel, **overrides):
    torch.manual_seed(0)
    bert_class(BertConfig(**{**TINY_BERT, **overrides})).save_pretrained(folder)
    return folder


def save_state_dict(folder, config, state_dict):
    """A checkpoint folder as save_pretrained writes it, with exactly these tensors."""
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    save_file(
        {k: v.contiguous() for k, v in state_dict.items()}, folder / "model.safetensors", metadata={"format": "pt"}
    )
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A tiny BertModel checkpoint (with pooler, no tokenizer)."""
    return save_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def seqbert_folder(tmp_path_factory):
    """A tiny SeqBertModel folder written by save_pretrained (no tokenizer)."""
    folder = tmp_path_factory.mktemp("seqbert")
    torch.manual_seed(0)
    seqbert.SeqBertModel(seqbert.SeqBertConfig(**TINY_BERT)).save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------------
# 1. Not a BERT checkpoint
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", [seqbert.SeqBertModel, seqbert.SeqBertForConditionalGeneration])
@pytest.mark.parametrize("kind", ["roberta", "gpt2"])
def test_non_bert_checkpoint_names_argument_value_model_type_and_allowed(tmp_path, kind, model_class):
    torch.manual_seed(0)
    if kind == "roberta":
        RobertaModel(RobertaConfig(**TINY_BERT)).save_pretrained(tmp_path)
    else:
        GPT2Model(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64)).save_pretrained(tmp_path)
    allowed = "'bert' or 'encoder-decoder' (BERT2BERT)" if model_class.can_generate() else "'bert'"
    with pytest.raises(ValueError) as error:
        model_class.from_bert_pretrained(tmp_path)
    message = str(error.value)
    assert f"pretrained_model_name_or_path ({str(tmp_path)!r})" in message
    assert f"is a {kind!r} checkpoint, not BERT" in message
    assert f"model_type must be {allowed}" in message


def test_seqbert_checkpoint_is_pointed_to_from_pretrained(seqbert_folder):
    with pytest.raises(ValueError, match=r"'seqbert' checkpoint, not BERT.*already a SeqBERT checkpoint: load it with from_pretrained"):  # fmt: skip
        seqbert.SeqBertForMaskedLM.from_bert_pretrained(seqbert_folder)


# ----------------------------------------------------------------------------------------------------------------------
# 2. Shape-incompatible configs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,expected",
    [
        ({"hidden_size": 64}, r"embeddings\.word_embeddings\.weight: checkpoint \(99, 32\) vs model \(99, 64\).*hidden_size=64 \(the checkpoint's config has 32\)"),
        ({"intermediate_size": 48}, r"encoder\.layers\.0\.mlp\.down_proj\.weight: checkpoint \(32, 37\) vs model \(32, 48\).*intermediate_size=48 \(the checkpoint's config has 37\)"),
        ({"vocab_size": 120}, r"embeddings\.word_embeddings\.weight: checkpoint \(99, 32\) vs model \(120, 32\).*vocab_size=120 \(the checkpoint's config has 99\)"),
        ({"hidden_size": 40, "num_attention_heads": 5}, r"hidden_size=40 \(the checkpoint's config has 32\)"),
    ],
)  # fmt: skip
def test_from_bert_pretrained_shape_changing_override(bert_folder, override, expected):
    with pytest.raises(ValueError, match=r"SeqBertModel\.from_bert_pretrained\(.*\): \d+ parameter\(s\) of the checkpoint have another shape.*" + expected + r".*ignore_mismatched_sizes=True"):  # fmt: skip
        seqbert.SeqBertModel.from_bert_pretrained(bert_folder, **override)


def test_from_bert_pretrained_num_labels_mismatch_and_ignore_mismatched_sizes(tmp_path):
    folder = save_bert(tmp_path, BertForSequenceClassification, num_labels=3)
    with pytest.raises(ValueError, match=r"classifier\.weight: checkpoint \(3, 32\) vs model \(5, 32\).*num_labels=5 \(the checkpoint's config has 3\)"):  # fmt: skip
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(folder, num_labels=5)
    # Opting in gives transformers' behaviour: the classifier is re-initialised and reported, the body loads.
    model, info = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        folder, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert {name for name, _, _ in info["mismatched_keys"]} == {"classifier.weight", "classifier.bias"}
    bert = load_file(folder / "model.safetensors")
    assert torch.equal(model.seqbert.embeddings.word_embeddings.weight, bert["bert.embeddings.word_embeddings.weight"])


def test_num_attention_heads_changes_no_shape_but_is_validated_and_warned(bert_folder):
    # SeqBERT's query/key/value are (H, H) whatever the head count: a head count that does not divide hidden_size is a
    # config error; one that does loads every tensor, with a warning that the model computes something else.
    with pytest.raises(ValueError, match=r"hidden_size \(32\) must be divisible by num_attention_heads \(5\)"):
        seqbert.SeqBertModel.from_bert_pretrained(bert_folder, num_attention_heads=5)
    logger = logging.get_logger("seqbert.convert_bert")
    with CaptureLogger(logger) as captured:
        model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder, num_attention_heads=8)
    assert "num_attention_heads=8 differs from the BERT checkpoint" in captured.out
    assert model.config.num_attention_heads == 8


@pytest.mark.parametrize(
    "how",
    ["override", "config", "auto"],
)
def test_from_pretrained_with_incompatible_config(seqbert_folder, how):
    if how == "override":
        load = lambda: seqbert.SeqBertModel.from_pretrained(seqbert_folder, hidden_size=64)  # noqa: E731
        expected = r"hidden_size=64 \(the checkpoint's config has 32\)"
    elif how == "config":
        config = seqbert.SeqBertConfig(**{**TINY_BERT, "intermediate_size": 50})
        load = lambda: seqbert.SeqBertModel.from_pretrained(seqbert_folder, config=config)  # noqa: E731
        expected = r"mlp\.up_proj\.weight: checkpoint \(37, 32\) vs model \(50, 32\).*intermediate_size=50 \(the checkpoint's config has 37\)"  # fmt: skip
    else:
        load = lambda: AutoModel.from_pretrained(seqbert_folder, vocab_size=120)  # noqa: E731
        expected = r"checkpoint \(99, 32\) vs model \(120, 32\).*vocab_size=120 \(the checkpoint's config has 99\)"
    with pytest.raises(ValueError, match=r"SeqBertModel\.from_pretrained\(.*\): \d+ parameter\(s\).*" + expected):
        load()


def test_mismatched_shapes_raise_what_transformers_raises(tmp_path):
    """`from_pretrained(folder, num_labels=42)` on a 3-label classifier: transformers raises RuntimeError there, and
    user code catches that; SeqBERT's error is one, and a ValueError too (a config value causes it)."""
    model = seqbert.SeqBertForSequenceClassification(seqbert.SeqBertConfig(**TINY_BERT, num_labels=3))
    model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match=r"classifier\.weight: checkpoint \(3, 32\) vs model \(42, 32\)") as caught:
        AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=42)
    assert isinstance(caught.value, ValueError)
    bert = save_bert(tmp_path / "bert", BertForSequenceClassification, num_labels=3)
    with pytest.raises(RuntimeError, match=r"num_labels=42 \(the checkpoint's config has 3\)"):
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(bert, num_labels=42)


def test_from_pretrained_ignore_mismatched_sizes_keeps_transformers_behaviour(seqbert_folder):
    model, info = seqbert.SeqBertModel.from_pretrained(
        seqbert_folder, vocab_size=120, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert [name for name, _, _ in info["mismatched_keys"]] == ["embeddings.word_embeddings.weight"]
    assert model.embeddings.word_embeddings.weight.shape == (120, 32)
    # Without mismatches the plain call still returns the model alone, and the loading info on request.
    assert isinstance(seqbert.SeqBertModel.from_pretrained(seqbert_folder), seqbert.SeqBertModel)
    _, info = seqbert.SeqBertModel.from_pretrained(seqbert_folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]


# ----------------------------------------------------------------------------------------------------------------------
# 3. Truncated or corrupt files
# ----------------------------------------------------------------------------------------------------------------------


def damage(folder, kind: str):
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if kind == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "garbage_header_length":
        weights.write_bytes(b"\xff" * 8 + data[8:])
    elif kind == "garbage_header":
        weights.write_bytes(data[:8] + b"#garbage" * 8 + data[72:])
    elif kind == "empty":
        weights.write_bytes(b"")
    elif kind == "config":
        (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    return folder / ("config.json" if kind == "config" else "model.safetensors")


LOADERS = {
    "from_bert_pretrained": ("bert_folder", lambda path: seqbert.SeqBertForMaskedLM.from_bert_pretrained(path)),
    "from_pretrained": ("seqbert_folder", lambda path: seqbert.SeqBertModel.from_pretrained(path)),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("kind", ["truncated", "garbage_header_length", "garbage_header", "empty", "config"])
def test_damaged_file_names_the_file_and_says_to_redownload(request, tmp_path, loader, kind):
    fixture, load = LOADERS[loader]
    folder = tmp_path / "copy"
    shutil.copytree(request.getfixturevalue(fixture), folder)
    damaged = damage(folder, kind)
    with pytest.raises(OSError) as error:
        load(folder)
    message = str(error.value)
    assert message.startswith(f"{damaged} is truncated or corrupt ("), message
    assert "re-download it" in message and "save it again with save_pretrained" in message


@pytest.mark.parametrize("loader", list(LOADERS))
def test_sharded_checkpoint_with_a_missing_shard(request, tmp_path, loader):
    fixture, load = LOADERS[loader]
    model_class = BertModel if loader == "from_bert_pretrained" else seqbert.SeqBertModel
    config_class = BertConfig if loader == "from_bert_pretrained" else seqbert.SeqBertConfig
    torch.manual_seed(0)
    model_class(config_class(**TINY_BERT)).save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    with pytest.raises(OSError, match=re.escape(f"{tmp_path / 'model.safetensors.index.json'} names the weight file {shards[1].name}, which is missing") + r".*incomplete.*re-download"):  # fmt: skip
        load(tmp_path)


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -2.27e36])
def test_weights_with_non_finite_values_are_refused(request, tmp_path, loader, value):
    """Found by the damaged-folder fuzzing: a bit flipped inside a safetensors file's tensor data (the format has no
    checksum) can make a weight NaN, or finite but so large (-2.27e36, from a flipped exponent bit, in the campaign)
    that the forward pass overflows; the model loaded silently and gave NaN outputs. The loaders now refuse such
    weights and name them."""
    fixture, load = LOADERS[loader]
    folder = tmp_path / "copy"
    shutil.copytree(request.getfixturevalue(fixture), folder)
    tensors = load_file(folder / "model.safetensors")
    key = next(k for k in sorted(tensors) if k.endswith("intermediate.dense.weight") or k.endswith("up_proj.weight"))
    tensors[key][3, 5] = value
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        OSError, match=r"the loaded weights hold NaN, infinite or implausibly large \(above 1e\+08\) values in "
    ) as error:
        load(folder)
    message = str(error.value)
    assert str(folder) in message and "layers.0.mlp.up_proj.weight" in message, message
    assert "A weights file is damaged" in message and "re-download it" in message


@pytest.mark.parametrize("subfolder", ["", "model"])
def test_a_folder_without_config_json_names_the_file(tmp_path, seqbert_folder, subfolder):
    """transformers builds a default config for a folder without config.json, and the default-sized model then
    reported 41 parameters as a shape mismatch; the missing file is named instead, for the class and for AutoModel's
    registered path. An explicit config= needs no config.json."""
    folder = tmp_path / "damaged"
    shutil.copytree(seqbert_folder, folder / subfolder)
    (folder / subfolder / "config.json").unlink()
    expected = r"has no config\.json" + (r" in subfolder 'model'" if subfolder else "") + r" \(it holds: "
    for load in (seqbert.SeqBertModel.from_pretrained, seqbert.SeqBertForSequenceClassification.from_pretrained):
        with pytest.raises(OSError, match=expected + r".*model\.safetensors.*pass config= explicitly"):
            load(folder, subfolder=subfolder)
    config = seqbert.SeqBertConfig(**TINY_BERT)
    loaded = seqbert.SeqBertModel.from_pretrained(folder, subfolder=subfolder, config=config)
    assert torch.equal(
        loaded.embeddings.word_embeddings.weight,
        load_file(seqbert_folder / "model.safetensors")["embeddings.word_embeddings.weight"],
    )


def test_corrupt_weight_index(tmp_path, seqbert_folder):
    torch.manual_seed(0)
    seqbert.SeqBertModel(seqbert.SeqBertConfig(**TINY_BERT)).save_pretrained(tmp_path, max_shard_size="20KB")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {')
    with pytest.raises(OSError, match=r"model\.safetensors\.index\.json is truncated or corrupt \(not valid JSON"):
        seqbert.SeqBertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_truncated_pickled_weights(request, tmp_path, loader):
    fixture, load = LOADERS[loader]
    source = request.getfixturevalue(fixture)
    shutil.copy(source / "config.json", tmp_path / "config.json")
    torch.save(load_file(source / "model.safetensors"), tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    model_class = seqbert.SeqBertForMaskedLM if loader == "from_bert_pretrained" else seqbert.SeqBertModel
    method = getattr(model_class, loader)
    with pytest.raises(OSError, match=re.escape(f"{tmp_path / 'pytorch_model.bin'} is truncated or corrupt")):
        method(tmp_path, use_safetensors=False)


def test_safetensors_file_problem_accepts_sound_files(minilm_path, seqbert_folder, bert_folder):
    for folder in (minilm_path, seqbert_folder, bert_folder):
        assert checkpoint_loading.safetensors_file_problem(folder / "model.safetensors") is None


# ----------------------------------------------------------------------------------------------------------------------
# 4. Missing tokenizer
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_auto_tokenizer_on_a_model_folder_without_tokenizer_raises(seqbert_folder, trust_remote_code):
    # transformers' own error (a ValueError about the tokenizer backend, not an OSError); what matters is that no
    # tokenizer is made up.
    with pytest.raises((OSError, ValueError)):
        AutoTokenizer.from_pretrained(seqbert_folder, trust_remote_code=trust_remote_code)


def test_seq2seq_warm_start_without_tokenizer(bert_folder):
    # transformers would build a BertTokenizer with an empty vocabulary here ([CLS] = id 2): never used silently.
    with pytest.raises(ValueError, match=r"has no tokenizer \(tokenizer\.json or vocab\.txt\).*\(decoder_start_token_id, eos_token_id\): pass decoder_start_token_id= and eos_token_id="):  # fmt: skip
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(bert_folder)
    with pytest.raises(ValueError, match=r"decoding \(eos_token_id\): pass"):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(bert_folder, decoder_start_token_id=1)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(bert_folder, **GENERATION_IDS)
    assert model.generation_config.decoder_start_token_id == 1 and model.generation_config.eos_token_id == 2


def test_seq2seq_warm_start_reads_ids_from_the_tokenizer(tmp_path, tokenizer):
    folder = save_bert(tmp_path, vocab_size=tokenizer.vocab_size)
    tokenizer.save_pretrained(folder)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder)
    assert model.generation_config.decoder_start_token_id == tokenizer.cls_token_id == 101
    assert model.generation_config.eos_token_id == tokenizer.sep_token_id == 102


# ----------------------------------------------------------------------------------------------------------------------
# 5. Nothing outside the task heads keeps its random initialisation
# ----------------------------------------------------------------------------------------------------------------------


def expected_bert_tensor(name: str, bert: dict[str, torch.Tensor]) -> torch.Tensor:
    """The BERT tensor a SeqBERT body parameter must equal (written independently of convert_bert's renames)."""
    name = re.sub(r"^(seqbert\.encoder|decoder)\.layers\.", "layers.", name)
    name = re.sub(r"^(seqbert|decoder)\.", "", name)
    if name.startswith("embeddings."):
        return bert[name.replace("layer_norm", "LayerNorm")]
    if name.startswith("pooler."):
        return bert[name]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name)
    assert match, f"{name} is not a BERT body parameter"
    layer, part, kind = match.groups()
    prefix = f"encoder.layer.{layer}."
    part = part.removeprefix("self_")  # the decoder's self-attention is BERT's attention
    part = part.removeprefix("cross_")  # and so, by default, is its cross-attention (cross_attention_init)
    bert_part = {
        "attention.query": "attention.self.query",
        "attention.key": "attention.self.key",
        "attention.value": "attention.self.value",
        "attention.out_proj": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "mlp.up_proj": "intermediate.dense",
        "mlp.down_proj": "output.dense",
        "mlp_norm": "output.LayerNorm",
    }
    assert part in bert_part, f"{name} is not a BERT body parameter"
    return bert[f"{prefix}{bert_part[part]}.{kind}"]


@pytest.fixture(scope="module")
def minilm_tensors(minilm_path):
    return load_file(minilm_path / "model.safetensors")


@pytest.mark.parametrize("model_class", HEAD_CLASSES, ids=lambda c: c.__name__)
def test_every_non_head_parameter_equals_the_minilm_tensor_it_came_from(minilm_path, minilm_tensors, model_class):
    model, info = model_class.from_bert_pretrained(minilm_path, output_loading_info=True)
    checked = 0
    for name, tensor in model.state_dict().items():
        canonical = name if name.startswith(TOP_LEVEL) else f"seqbert.{name}"  # a base model has no `seqbert.`
        if canonical == "lm_head.decoder.weight":  # tied: it is the (decoder's) word embedding matrix
            assert torch.equal(tensor, minilm_tensors["embeddings.word_embeddings.weight"])
        elif canonical.startswith(("classifier.", "qa_outputs.", "lm_head.")):
            assert name in info["missing_keys"], name  # MiniLM has no task head
        else:
            # Both: the loader says it loaded it, and it holds the BERT values (some, like MiniLM's pooler bias, are
            # all zeros and so equal to their initialisation).
            assert name not in info["missing_keys"], name
            assert torch.equal(tensor, expected_bert_tensor(canonical, minilm_tensors)), name
            checked += 1
    # Embeddings (5) + 6 layers x 16 tensors per stack, plus the pooler (2) in the classes whose BERT twin has one, and
    # the seq2seq decoder's cross-attention (6 layers x 10 tensors, copies of BERT's attention).
    stacks = 2 if model_class.can_generate() else 1
    pooled = model_class in (
        seqbert.SeqBertModel, seqbert.SeqBertForSequenceClassification, seqbert.SeqBertForMultipleChoice
    )  # fmt: skip
    cross = model_class is seqbert.SeqBertForConditionalGeneration
    assert checked == stacks * (5 + 6 * 16) + 2 * pooled + 6 * 10 * cross


def test_bert_checkpoint_missing_one_layer_is_rejected(tmp_path, bert_folder):
    bert = load_file(bert_folder / "model.safetensors")
    incomplete = {k: v for k, v in bert.items() if not k.startswith("encoder.layer.1.")}
    folder = save_state_dict(tmp_path, BertConfig.from_pretrained(bert_folder), incomplete)
    with pytest.raises(ValueError, match=r"from_bert_pretrained\(.*\): 16 parameter\(s\) outside the task heads are not in the checkpoint and would keep their random initialisation: encoder\.layers\.1\.attention\.key\.bias, .* \(and 11 more\)\. Likely cause: the checkpoint lacks these tensors, so it is incomplete or corrupt"):  # fmt: skip
        seqbert.SeqBertModel.from_bert_pretrained(folder)


def test_bert_checkpoint_missing_one_tensor_is_rejected(tmp_path, bert_folder):
    bert = load_file(bert_folder / "model.safetensors")
    del bert["encoder.layer.0.output.LayerNorm.weight"]
    folder = save_state_dict(tmp_path, BertConfig.from_pretrained(bert_folder), bert)
    with pytest.raises(
        ValueError, match=r": 1 parameter\(s\) .*: seqbert\.encoder\.layers\.0\.mlp_norm\.weight\. Likely"
    ):
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(folder)


def test_more_layers_than_the_checkpoint_is_rejected(bert_folder):
    with pytest.raises(ValueError, match=r"encoder\.layers\.2\..*num_hidden_layers=3 but the checkpoint has 2 layers"):
        seqbert.SeqBertModel.from_bert_pretrained(bert_folder, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"decoder\.layers\.2\..*num_decoder_layers=3 but the checkpoint has 2 layers"):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
            bert_folder, num_decoder_layers=3, cross_attention_source="last_layer", **GENERATION_IDS
        )
    # The default warm start pairs decoder layer i with encoder layer i: a third decoder layer has none to read.
    with pytest.raises(ValueError, match=r"num_decoder_layers \(3\) must be <= num_hidden_layers \(2\)"):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
            bert_folder, num_decoder_layers=3, **GENERATION_IDS
        )


def test_pre_layer_norm_override_is_rejected(bert_folder):
    with pytest.raises(
        ValueError, match=r"encoder\.final_layer_norm\.bias.*norm_placement='pre' adds a final LayerNorm"
    ):
        seqbert.SeqBertModel.from_bert_pretrained(bert_folder, norm_placement="pre")


def test_fewer_layers_than_the_checkpoint_is_a_reported_truncation(bert_folder):
    model, info = seqbert.SeqBertModel.from_bert_pretrained(bert_folder, num_hidden_layers=1, output_loading_info=True)
    assert len(model.encoder.layers) == 1 and not info["missing_keys"]
    assert "seqbert.encoder.layers.1.attention.query.weight" in info["unexpected_keys"]


def test_pooler_may_be_new_only_when_the_checkpoint_has_none(tmp_path, bert_folder):
    # A BertForMaskedLM checkpoint has no pooler: classification builds a new one, as BertForSequenceClassification.
    masked_lm = save_bert(tmp_path / "mlm", BertForMaskedLM)
    _, info = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(masked_lm, output_loading_info=True)
    assert set(info["missing_keys"]) == {"seqbert.pooler.dense.weight", "seqbert.pooler.dense.bias", "classifier.weight", "classifier.bias"}  # fmt: skip
    _, info = seqbert.SeqBertModel.from_bert_pretrained(masked_lm, output_loading_info=True)
    assert set(info["missing_keys"]) == {"pooler.dense.weight", "pooler.dense.bias"}
    # Half a pooler is a damaged checkpoint.
    bert = load_file(bert_folder / "model.safetensors")
    del bert["pooler.dense.bias"]
    folder = save_state_dict(tmp_path / "half_pooler", BertConfig.from_pretrained(bert_folder), bert)
    with pytest.raises(ValueError, match=r"1 parameter\(s\) outside the task heads .*: pooler\.dense\.bias\."):
        seqbert.SeqBertModel.from_bert_pretrained(folder)


def test_warm_start_cross_attention_is_the_only_new_decoder_part(bert_folder):
    model, info = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
        bert_folder, output_loading_info=True, cross_attention_init="random", **GENERATION_IDS
    )
    body = [k for k in info["missing_keys"] if not k.startswith("lm_head.")]
    assert body and all(re.match(r"decoder\.layers\.\d\.cross_attention(_norm)?\.", k) for k in body), body


def test_a_seqbert_0_1_folder_with_fused_attention_fails_clearly_and_splits_exactly(tmp_path):
    """seqbert 0.1.0 saved `qkv_proj` (query, key, value stacked): loading such a folder must not leave the separate
    projections random; `split_fused_attention` turns it into this version's layout with the same numbers."""
    model = seqbert.SeqBertForSequenceClassification(seqbert.SeqBertConfig(**TINY_BERT, num_labels=2)).eval()
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    fused = {}
    for key, tensor in weights.items():
        if ".attention.query." in key:
            kind = key.rsplit(".", 1)[-1]
            prefix = key.rsplit(".query.", 1)[0]
            parts = [weights[f"{prefix}.{name}.{kind}"] for name in ("query", "key", "value")]
            fused[f"{prefix}.qkv_proj.{kind}"] = torch.cat(parts)
        elif not re.search(r"\.attention\.(key|value)\.", key):
            fused[key] = tensor
    save_file(fused, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"fused attention projections \(seqbert\.encoder\.layers\.0\.attention\.qkv_proj\.bias.*seqbert 0\.1\.0.*split_fused_attention"):  # fmt: skip
        AutoModelForSequenceClassification.from_pretrained(tmp_path)
    save_file(split_fused_attention(load_file(tmp_path / "model.safetensors")), tmp_path / "model.safetensors")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, 99, (2, 6))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
