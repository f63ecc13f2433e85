"""PEFT on SeqBERT as on BERT: the default `LoraConfig(task_type=...)` adapts queries and values of every head, with
exactly BERT's number of LoRA parameters; a BERT LoRA recipe trains to BERT's numbers; and training, saving,
`PeftModel.from_pretrained`, `AutoPeftModelForSequenceClassification` and `merge_and_unload` keep the outputs."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import SCRIPT_PATHS, run_without_seqbert
from peft import AutoPeftModelForSequenceClassification, LoraConfig, PeftModel, get_peft_model
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
)

import seqbert


# Each SeqBERT head, its PEFT task type (None: no task-specific wrapper) and the BERT class it mirrors.
HEADS = [
    (seqbert.SeqBertModel, "FEATURE_EXTRACTION", BertModel),
    (seqbert.SeqBertForMaskedLM, None, BertForMaskedLM),
    (seqbert.SeqBertForSequenceClassification, "SEQ_CLS", BertForSequenceClassification),
    (seqbert.SeqBertForTokenClassification, "TOKEN_CLS", BertForTokenClassification),
    (seqbert.SeqBertForQuestionAnswering, "QUESTION_ANS", BertForQuestionAnswering),
    (seqbert.SeqBertForMultipleChoice, None, BertForMultipleChoice),
    (seqbert.SeqBertForCausalLM, "CAUSAL_LM", BertLMHeadModel),
]
SMALL_BERT = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, is_decoder=False
)


def lora_parameters(model) -> dict[str, int]:
    """LoRA parameter count per adapted module kind (the last name before `.lora_A` / `.lora_B`)."""
    counts: dict[str, int] = {}
    for name, parameter in model.named_parameters():
        if ".lora_" in name:
            kind = name.split(".lora_")[0].rsplit(".", 1)[-1]
            counts[kind] = counts.get(kind, 0) + parameter.numel()
    return counts


@pytest.mark.parametrize("seqbert_class,task_type,bert_class", HEADS, ids=lambda x: getattr(x, "__name__", x))
def test_default_lora_adapts_queries_and_values_like_bert(seqbert_class, task_type, bert_class):
    bert_config = BertConfig(**{**SMALL_BERT, "is_decoder": bert_class is BertLMHeadModel})
    bert = get_peft_model(bert_class(bert_config), LoraConfig(task_type=task_type))
    mine = get_peft_model(
        seqbert_class(seqbert.SeqBertConfig.from_bert_config(bert_config)), LoraConfig(task_type=task_type)
    )
    # 2 layers x rank 8 x (32 inputs + 32 outputs) per adapted projection; no keys.
    assert lora_parameters(mine) == lora_parameters(bert) == {"query": 2 * 8 * (32 + 32), "value": 2 * 8 * (32 + 32)}
    trainable = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in (mine, bert)]
    assert trainable[0] == trainable[1]


def test_default_lora_on_seq2seq_adapts_self_and_cross_attention():
    config = seqbert.SeqBertConfig(**{**SMALL_BERT, "is_encoder_decoder": True, "decoder_start_token_id": 2})
    model = get_peft_model(seqbert.SeqBertForConditionalGeneration(config), LoraConfig(task_type="SEQ_2_SEQ_LM"))
    adapted = {name.split(".lora_A")[0] for name, _ in model.named_parameters() if ".lora_A" in name}
    suffixes = {name.split(".", 3)[-1] for name in adapted}
    assert {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name in suffixes} == {
        "attention.query", "attention.value", "self_attention.query", "self_attention.value",
        "cross_attention.query", "cross_attention.value",
    }  # fmt: skip


@pytest.fixture(scope="module")
def snippets(tokenizer, rt_texts):
    batch = tokenizer(rt_texts[:16], padding=True, return_tensors="pt")
    return dict(batch), torch.tensor([i % 2 for i in range(16)])


def _train(model, batch, labels, steps=3):
    """A few AdamW steps on the adapter (and the classifier PEFT keeps trainable); returns the losses."""
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_bert_lora_recipe_trains_to_berts_numbers(minilm_path, snippets):
    """`target_modules=["query", "value"]`, the BERT recipe, on MiniLM: SeqBERT and BERT train the same adapter."""
    batch, labels = snippets
    config = dict(task_type="SEQ_CLS", r=4, target_modules=["query", "value"], lora_dropout=0.0)
    bert = BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2, hidden_dropout_prob=0.0)
    mine = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        minilm_path, num_labels=2, hidden_dropout_prob=0.0
    )
    mine.classifier.load_state_dict(bert.classifier.state_dict())
    models = []
    for model in (bert, mine):
        torch.manual_seed(0)  # the same LoRA A initialisation, module by module
        models.append(get_peft_model(model, LoraConfig(**config)))
    bert_losses, my_losses = (_train(model, batch, labels) for model in models)
    assert max(abs(a - b) for a, b in zip(bert_losses, my_losses, strict=True)) <= 1e-5
    with torch.no_grad():
        expected, got = (model.eval()(**batch).logits for model in models)
    assert (got - expected).abs().max().item() <= 1e-5


def test_adapter_save_reload_auto_class_and_merge_keep_the_outputs(minilm_path, tokenizer, snippets, tmp_path):
    batch, labels = snippets
    base_dir = tmp_path / "base"
    subprocess.run(
        [sys.executable, str(SCRIPT_PATHS["convert_bert_checkpoint.py"]), "--bert_model_name_or_path",
         str(minilm_path), "--output_dir", str(base_dir), "--model_class", "SeqBertForSequenceClassification",
         "--num_labels", "2"],
        check=True, capture_output=True,
    )  # fmt: skip
    base = seqbert.SeqBertForSequenceClassification.from_pretrained(base_dir)
    assert base.name_or_path == str(base_dir)
    model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4))
    losses = _train(model, batch, labels)
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        expected = model(**batch).logits
    model.save_pretrained(tmp_path / "adapter")
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base_dir)
    assert set(adapter_config["target_modules"]) == {"query", "value"}

    fresh = seqbert.SeqBertForSequenceClassification.from_pretrained(base_dir)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    auto = AutoPeftModelForSequenceClassification.from_pretrained(tmp_path / "adapter").eval()
    assert type(auto.base_model.model) is seqbert.SeqBertForSequenceClassification
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, expected)
        assert torch.equal(auto(**batch).logits, expected)
        merged = reloaded.merge_and_unload().eval()
        assert type(merged) is seqbert.SeqBertForSequenceClassification
        assert (merged(**batch).logits - expected).abs().max().item() <= 1e-5


def test_from_bert_pretrained_records_the_checkpoint_for_peft(minilm_path):
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, num_labels=2)
    assert model.name_or_path == model.config.name_or_path == str(minilm_path)
    peft_model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS"))
    assert peft_model.peft_config["default"].base_model_name_or_path == str(minilm_path)


def test_default_lora_on_remote_code_with_peft_imported_first(minilm_path, tmp_path):
    """A user without seqbert who imports peft before loading a SeqBERT folder with trust_remote_code: the model code
    registers its PEFT targets on import, so the default LoRA still adapts queries and values."""
    folder = tmp_path / "classifier"
    seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, num_labels=2).save_pretrained(folder)
    outputs = run_without_seqbert([{"name": "lora", "mode": "lora", "folder": str(folder)}], tmp_path)
    bert = get_peft_model(
        BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2), LoraConfig(task_type="SEQ_CLS")
    )
    assert {k.split(".", 1)[1]: v.item() for k, v in outputs.items()} == lora_parameters(bert)
