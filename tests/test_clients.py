"""The client suite: what a BERT user does with BERT in the libraries paired with transformers, done once with
transformers' own BERT classes and once with SeqBERT converted from the same folder, and the results compared.

Every flow loads both models from one saved folder (the real MiniLM-L6 checkpoint with seeded heads where a head is
needed) and runs on real Rotten Tomatoes snippets; results must be equal within fp32 parity (`TOLERANCE`: BERT's and
SeqBERT's products sum in another order on padded batches), quantized ones within the quantizer's own error. Training
flows switch dropout off, since BERT draws its dropout masks over padding and SeqBERT over real tokens only. What
transformers' own BERT cannot do on 5.x is no SeqBERT case: docs/index.md lists it ("Works with").

- pipelines beyond tests/test_pipelines.py: token classification with aggregation, zero-shot classification, batched
  text classification, text generation;
- `Trainer` options: NEFTune (Jain et al. 2023; its noise hook sees BERT's (B, L, H), so its bound alpha / sqrt(L H)
  and its draws are BERT's), length-grouped sampling, multi-label classification, regression, non-reentrant gradient
  checkpointing; `Seq2SeqTrainer` is in tests/test_bert2bert.py;
- accelerate's big-model loading: `init_empty_weights` + `load_checkpoint_and_dispatch`, `device_map` with disk
  offload;
- attention implementations switched on a loaded model: eager, sdpa, flex attention;
- sentence-transformers' `CrossEncoder`, and SetFit;
- PEFT beyond LoRA (tests/test_peft.py): IA3, LoHa, prompt tuning, P-tuning (prefix tuning: see docs/index.md);
- transformers' quantizers on CPU: torchao int8 weight-only and int8 dynamic, quanto int8, bitsandbytes 8-bit, and
  saved quantized folders reloaded (with seqbert, and torchao's without it);
- captum's `LayerIntegratedGradients` on the word embeddings of a padded batch; adversarial training on the input
  embeddings (FGM, Miyato et al. 2017);
- `inputs_embeds`, multiple choice, `resize_token_embeddings`.
"""

import copy

import pytest
import torch
from conftest import run_without_seqbert
from safetensors.torch import save_file
from transformers import (
    AutoModel,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    pipeline,
)

import seqbert
from seqbert.hub import copy_sentence_transformers_modules


# The difference between BERT's and SeqBERT's fp32 results on these inputs (their products sum in another order).
TOLERANCE = 1e-5
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

# BERT class -> the SeqBERT class converted from it.
SEQBERT_CLASS = {
    BertModel: seqbert.SeqBertModel,
    BertForSequenceClassification: seqbert.SeqBertForSequenceClassification,
    BertForTokenClassification: seqbert.SeqBertForTokenClassification,
    BertForMaskedLM: seqbert.SeqBertForMaskedLM,
    BertForMultipleChoice: seqbert.SeqBertForMultipleChoice,
    BertLMHeadModel: seqbert.SeqBertForCausalLM,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path, tokenizer):
    """`folders(bert_class, **config)`: a BERT folder of `bert_class` (MiniLM-L6 weights, a head seeded with 0) and
    the SeqBERT folder converted from it (`from_bert_pretrained`, saved with the tokenizer), made once each."""
    made = {}

    def make(bert_class, **config):
        key = (bert_class, repr(sorted(config.items())))
        if key not in made:
            root = tmp_path_factory.mktemp(bert_class.__name__)
            torch.manual_seed(0)
            bert_class.from_pretrained(minilm_path, **config).save_pretrained(root / "bert")
            tokenizer.save_pretrained(root / "bert")
            SEQBERT_CLASS[bert_class].from_bert_pretrained(root / "bert").save_pretrained(root / "seqbert")
            tokenizer.save_pretrained(root / "seqbert")
            made[key] = root / "bert", root / "seqbert"
        return made[key]

    return make


def load_pair(folders, bert_class, config=None, **overrides) -> dict[str, torch.nn.Module]:
    """transformers' BERT model and SeqBERT's, each from its folder of `folders(bert_class, **config)`, with the same
    `from_pretrained` overrides."""
    bert_folder, seqbert_folder = folders(bert_class, **(config or {}))
    return {
        "bert": bert_class.from_pretrained(bert_folder, **overrides),
        "seqbert": SEQBERT_CLASS[bert_class].from_pretrained(seqbert_folder, **overrides),
    }


def assert_close(got, expected, tolerance: float = TOLERANCE) -> None:
    got, expected = torch.as_tensor(got, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    scale = max(expected.abs().max().item(), 1.0)
    assert (got - expected).abs().max().item() <= tolerance * scale, (got - expected).abs().max().item()


# ----------------------------------------------------------------------------------------------------------------------
# Pipelines
# ----------------------------------------------------------------------------------------------------------------------


def test_token_classification_pipeline_with_aggregation(folders, tokenizer, rt_texts):
    models = load_pair(folders, BertForTokenClassification, {"num_labels": 5})
    entities = {}
    for name, model in models.items():
        tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="simple")
        entities[name] = tagger(rt_texts[:4])
    for mine, bert in zip(entities["seqbert"], entities["bert"], strict=True):
        assert [(e["entity_group"], e["start"], e["end"]) for e in mine] == [
            (e["entity_group"], e["start"], e["end"]) for e in bert
        ]
        assert_close([e["score"] for e in mine], [e["score"] for e in bert])


def test_zero_shot_classification_pipeline(folders, tokenizer, rt_texts):
    labels = {"num_labels": 3, "label2id": {"contradiction": 0, "neutral": 1, "entailment": 2}}
    labels["id2label"] = {i: label for label, i in labels["label2id"].items()}
    models = load_pair(folders, BertForSequenceClassification, labels)
    results = {}
    for name, model in models.items():
        classifier = pipeline("zero-shot-classification", model=model, tokenizer=tokenizer)
        results[name] = classifier(rt_texts[:3], candidate_labels=["praise", "criticism", "plot"])
    for mine, bert in zip(results["seqbert"], results["bert"], strict=True):
        assert mine["labels"] == bert["labels"]
        assert_close(mine["scores"], bert["scores"])


def test_batched_text_classification_pipeline(folders, tokenizer, rt_texts):
    models = load_pair(folders, BertForSequenceClassification, {"num_labels": 2})
    scores = {}
    for name, model in models.items():
        classifier = pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None, batch_size=4)
        scores[name] = [sorted((r["label"], r["score"]) for r in result) for result in classifier(rt_texts[:10])]
    assert [[label for label, _ in r] for r in scores["seqbert"]] == [[label for label, _ in r] for r in scores["bert"]]
    assert_close([[s for _, s in r] for r in scores["seqbert"]], [[s for _, s in r] for r in scores["bert"]])


def test_text_generation_pipeline(folders, tokenizer):
    models = load_pair(folders, BertLMHeadModel, {"is_decoder": True})
    texts = {}
    for name, model in models.items():
        # A copy: the pipeline pads decoder-only prompts on the left, and sets that on the tokenizer it is given.
        generator = pipeline("text-generation", model=model, tokenizer=copy.deepcopy(tokenizer))
        texts[name] = generator("the film is", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert texts["seqbert"] == texts["bert"]


# ----------------------------------------------------------------------------------------------------------------------
# Trainer options
# ----------------------------------------------------------------------------------------------------------------------


def train_pair(models: dict, features: list[dict], tokenizer, tmp_path, callbacks=(), **options) -> dict[str, list]:
    """Two `Trainer` steps (batches of 4, seed 0, CPU) of each model on `features`; the logged losses per model."""
    losses = {}
    for name, model in models.items():
        arguments = TrainingArguments(
            output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0, **options,
        )  # fmt: skip
        trainer = Trainer(
            model,
            arguments,
            train_dataset=features,
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[callback(model) for callback in callbacks],
        )
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len(losses[name]) == 2
    return losses


class EmbeddingNoise(TrainerCallback):
    """Records, at each training step, the input embeddings before and after NEFTune's hook: a forward hook on the
    embedding layer registered before NEFTune's (it sees the clean output) and one after (the noisy one)."""

    def __init__(self, model):
        self.clean, self.noisy = [], []
        model.get_input_embeddings().register_forward_hook(lambda m, args, out: self.clean.append(out.detach()))

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # NEFTune's hook is on by then
        model.get_input_embeddings().register_forward_hook(lambda m, args, out: self.noisy.append(out.detach()))


def test_neftune_adds_berts_noise(folders, tokenizer, rt_texts, tmp_path):
    features = [{**tokenizer(text), "labels": i % 2} for i, text in enumerate(rt_texts[:8])]
    models = load_pair(folders, BertForSequenceClassification, {"num_labels": 2}, **NO_DROPOUT)
    noise = {}

    def recorder(model):
        noise[model] = EmbeddingNoise(model)
        return noise[model]

    losses = train_pair(models, features, tokenizer, tmp_path, callbacks=[recorder], neftune_noise_alpha=5)
    bert, mine = noise[models["bert"]], noise[models["seqbert"]]
    assert [x.shape for x in mine.noisy] == [x.shape for x in bert.noisy]  # (B, L, H): padded batches of 4
    assert len(mine.noisy) == 2 and mine.noisy[0].shape[0] == 4
    for clean, noisy, bert_clean, bert_noisy in zip(mine.clean, mine.noisy, bert.clean, bert.noisy, strict=True):
        bound = 5 / (noisy.shape[1] * noisy.shape[2]) ** 0.5  # NEFTune: alpha / sqrt(L * H)
        assert (noisy - clean).abs().max().item() <= bound
        torch.testing.assert_close(noisy - clean, bert_noisy - bert_clean)  # the same draws
    assert losses["seqbert"] == pytest.approx(losses["bert"], abs=TOLERANCE), losses


@pytest.mark.parametrize(
    "option",
    ["group_by_length", "multi_label", "regression", "non_reentrant_checkpointing"],
)
def test_trainer_options(folders, tokenizer, rt_texts, tmp_path, option):
    texts = rt_texts[:8]
    config, options = {"num_labels": 2}, {}
    labels = [i % 2 for i in range(len(texts))]
    if option == "group_by_length":
        options["train_sampling_strategy"] = "group_by_length"  # transformers 5's name for group_by_length=True
    elif option == "multi_label":
        config = {"num_labels": 3, "problem_type": "multi_label_classification"}
        labels = [[float(i % 2), float(i % 3 == 0), 1.0] for i in range(len(texts))]
    elif option == "regression":
        config = {"num_labels": 1}
        labels = [i / 8 for i in range(len(texts))]
    else:
        options = {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}}
    features = [{**tokenizer(text), "labels": label} for text, label in zip(texts, labels, strict=True)]
    models = load_pair(folders, BertForSequenceClassification, config, **NO_DROPOUT)
    losses = train_pair(models, features, tokenizer, tmp_path, **options)
    assert losses["seqbert"] == pytest.approx(losses["bert"], abs=TOLERANCE), losses


# ----------------------------------------------------------------------------------------------------------------------
# accelerate's big-model loading
# ----------------------------------------------------------------------------------------------------------------------


def test_init_empty_weights_and_load_checkpoint_and_dispatch(folders, tokenizer, rt_texts):
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch

    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    outputs = {}
    for name, folder in zip(("bert", "seqbert"), folders(BertModel), strict=True):
        model_class = BertModel if name == "bert" else seqbert.SeqBertModel
        with init_empty_weights():
            model = model_class(model_class.config_class.from_pretrained(folder))
        model = load_checkpoint_and_dispatch(model, str(folder / "model.safetensors"), device_map="auto").eval()
        with torch.no_grad():
            outputs[name] = model(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert_close(outputs["seqbert"][mask], outputs["bert"][mask])


def test_device_map_with_disk_offload(folders, tokenizer, rt_texts, tmp_path):
    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    outputs = {}
    for name, model in load_pair(
        folders, BertModel, device_map="auto", max_memory={"cpu": "40MiB"}, offload_folder=str(tmp_path / "offload")
    ).items():
        assert "disk" in set(model.hf_device_map.values()), model.hf_device_map
        with torch.no_grad():
            outputs[name] = model.eval()(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert_close(outputs["seqbert"][mask], outputs["bert"][mask])


# ----------------------------------------------------------------------------------------------------------------------
# Attention implementations
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
def test_attention_implementation_switched_on_a_loaded_model(folders, tokenizer, rt_texts, implementation):
    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    outputs = {}
    for name, model in load_pair(folders, BertModel).items():
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            outputs[name] = model.eval()(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert_close(outputs["seqbert"][mask], outputs["bert"][mask])


# ----------------------------------------------------------------------------------------------------------------------
# sentence-transformers and SetFit
# ----------------------------------------------------------------------------------------------------------------------


def test_sentence_transformers_cross_encoder(folders, rt_texts):
    from sentence_transformers import CrossEncoder

    pairs = list(zip(rt_texts[:6], rt_texts[6:12], strict=True))
    scores = {}
    for name, folder in zip(("bert", "seqbert"), folders(BertForSequenceClassification, num_labels=1), strict=True):
        encoder = CrossEncoder(str(folder), device="cpu")
        assert type(encoder.model).__name__ == ("BertForSequenceClassification" if name == "bert" else
                                                "SeqBertForSequenceClassification")  # fmt: skip
        scores[name] = encoder.predict(pairs, convert_to_tensor=True)
    assert_close(scores["seqbert"], scores["bert"])


def test_setfit(folders, minilm_path, rt_texts, tmp_path):
    import setfit  # the test extra pins it: a missing one is an error, not a skip
    from datasets import Dataset

    bert_folder, seqbert_folder = folders(BertModel)
    for folder in (bert_folder, seqbert_folder):  # MiniLM's sentence-transformers modules: mean pooling, normalize
        copy_sentence_transformers_modules(str(minilm_path), folder)
    train = Dataset.from_dict({"text": rt_texts[:8], "label": [i % 2 for i in range(8)]})
    embeddings, probabilities = {}, {}
    for name, folder in (("bert", bert_folder), ("seqbert", seqbert_folder)):
        model = setfit.SetFitModel.from_pretrained(str(folder))
        for module in model.model_body.modules():  # BERT draws dropout over padding too, SeqBERT over real tokens
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        arguments = setfit.TrainingArguments(
            output_dir=str(tmp_path / name), batch_size=4, num_epochs=1, max_steps=2, seed=0, report_to="none"
        )
        setfit.Trainer(model=model, args=arguments, train_dataset=train).train()
        embeddings[name] = model.model_body.encode(rt_texts[20:26], convert_to_tensor=True)
        probabilities[name] = model.predict_proba(rt_texts[20:26], as_numpy=True)
    # The fine-tuned sentence-transformers bodies: 6.6e-4 apart, measured (1e-6 with SetFit's body_learning_rate=0).
    # AdamW's first steps move every weight by about the learning rate times the sign of its gradient, whatever the
    # gradient's size, so the fp32 parity of BERT's and SeqBERT's gradients (1e-6) does not carry over to the weights.
    assert_close(embeddings["seqbert"], embeddings["bert"], 2e-3)
    # scikit-learn's logistic-regression head, fitted on them: the same labels, probabilities within that margin.
    assert (probabilities["seqbert"].argmax(-1) == probabilities["bert"].argmax(-1)).all()
    assert_close(probabilities["seqbert"], probabilities["bert"], 2e-3)


# ----------------------------------------------------------------------------------------------------------------------
# PEFT beyond LoRA (LoRA: tests/test_peft.py)
# ----------------------------------------------------------------------------------------------------------------------


def _peft_config(method: str):
    import peft

    if method == "ia3":  # PEFT's default targets for BERT (key, value, output.dense), registered for SeqBERT too
        return peft.IA3Config(task_type="SEQ_CLS")
    if method == "loha":
        return peft.LoHaConfig(task_type="SEQ_CLS", target_modules=["query", "value"], r=4, init_weights=False)
    if method == "p_tuning":  # virtual tokens from a small MLP encoder, prepended to the input embeddings
        return peft.PromptEncoderConfig(task_type="SEQ_CLS", num_virtual_tokens=4, encoder_hidden_size=32)
    return peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=4)


# Prefix tuning is left out: PEFT refuses transformers 5.x's BERT ("Model does not support past key values which are
# required for prefix tuning"), and SeqBERT alike (docs/index.md, "Works with").
@pytest.mark.parametrize("method", ["ia3", "loha", "prompt_tuning", "p_tuning"])
def test_peft_methods_beyond_lora(folders, tokenizer, rt_texts, method):
    import peft

    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    labels = torch.tensor([0, 1, 1, 0])
    results = {}
    for name, model in load_pair(folders, BertForSequenceClassification, {"num_labels": 2}, **NO_DROPOUT).items():
        torch.manual_seed(0)
        adapted = peft.get_peft_model(model, _peft_config(method))
        trainable = {
            n.replace("bert.", "").replace("seqbert.", "") for n, p in adapted.named_parameters() if p.requires_grad
        }
        adapted.train()
        output = adapted(**batch, labels=labels)
        output.loss.backward()
        gradients = sum(p.grad.norm() ** 2 for p in adapted.parameters() if p.grad is not None) ** 0.5
        results[name] = output.logits.detach(), output.loss.item(), gradients.item(), len(trainable)
    (logits, loss, gradient, count), (bert_logits, bert_loss, bert_gradient, bert_count) = (
        results["seqbert"],
        results["bert"],
    )
    assert count == bert_count
    assert_close(logits, bert_logits)
    assert abs(loss - bert_loss) <= TOLERANCE and abs(gradient - bert_gradient) <= 1e-4 * bert_gradient


# ----------------------------------------------------------------------------------------------------------------------
# transformers' quantizers
# ----------------------------------------------------------------------------------------------------------------------


def _quantization_config(name: str):
    from transformers import BitsAndBytesConfig, QuantoConfig, TorchAoConfig

    if name.startswith("torchao"):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

        recipe = (
            Int8WeightOnlyConfig() if name == "torchao_int8_weight_only" else Int8DynamicActivationInt8WeightConfig()
        )
        return TorchAoConfig(recipe)
    if name == "quanto_int8":
        return QuantoConfig(weights="int8")
    return BitsAndBytesConfig(load_in_8bit=True)


QUANTIZERS = ["torchao_int8_weight_only", "torchao_int8_dynamic", "quanto_int8", "bitsandbytes_8bit"]
# transformers cannot save a quanto-quantized model (BERT's neither): "not serializable".
SAVED = ["torchao_int8_weight_only", "torchao_int8_dynamic", "bitsandbytes_8bit"]


@pytest.fixture(scope="module")
def quantized(folders, tokenizer, rt_texts):
    """Each quantizer's BERT and SeqBERT (`AutoModel` on the converted folder), loaded by transformers with the same
    quantization config, and their last_hidden_state on a padded batch; the fp32 BERT's too."""
    batch = tokenizer(rt_texts[:6], padding=True, return_tensors="pt")
    bert_folder, seqbert_folder = folders(BertModel)
    with torch.no_grad():
        results = {"fp32": BertModel.from_pretrained(bert_folder).eval()(**batch).last_hidden_state, "batch": batch}
        for name in QUANTIZERS:
            models = {
                "bert": BertModel.from_pretrained(bert_folder, quantization_config=_quantization_config(name)),
                "seqbert": AutoModel.from_pretrained(seqbert_folder, quantization_config=_quantization_config(name)),
            }
            results[name] = {side: (m.eval(), m(**batch).last_hidden_state) for side, m in models.items()}
    return results


@pytest.mark.parametrize("name", QUANTIZERS)
def test_quantizers_give_berts_numbers_within_their_own_error(quantized, name):
    """SeqBERT quantized by transformers' quantizer against BERT quantized the same way: within the quantizer's own
    error (BERT quantized against BERT in fp32). torchao and quanto quantize the same weights the same way and the
    activations per token, so SeqBERT gives BERT's numbers; bitsandbytes' LLM.int8() picks its outlier columns over
    the whole batch, padding included for BERT, so the two differ within that error."""
    mask = quantized["batch"]["attention_mask"].bool()
    (_, mine), (_, bert) = quantized[name]["seqbert"], quantized[name]["bert"]
    assert type(quantized[name]["seqbert"][0]) is seqbert.SeqBertModel
    own_error = (bert - quantized["fp32"])[mask].abs().max().item()
    assert 0 < own_error < 1.0  # it did quantize
    delta = (mine - bert)[mask].abs().max().item()
    assert delta <= (TOLERANCE if not name.startswith("bitsandbytes") else own_error), (delta, own_error)


@pytest.mark.parametrize("name", SAVED)
def test_saved_quantized_folders_reload(quantized, name, tmp_path):
    batch, mask = quantized["batch"], quantized["batch"]["attention_mask"].bool()
    for side, model_class in (("bert", BertModel), ("seqbert", AutoModel)):
        model, before = quantized[name][side]
        model.save_pretrained(tmp_path / side)
        reloaded = model_class.from_pretrained(tmp_path / side).eval()
        with torch.no_grad():
            after = reloaded(**batch).last_hidden_state
        assert_close(after[mask], before[mask], 0.0)


def test_a_saved_torchao_folder_loads_without_seqbert(quantized, tmp_path):
    """The load check of a folder's own modeling code (`non_finite_weights_error`, which reads quantized weights through
    their dequantized values) in a process where seqbert cannot be imported."""
    model, before = quantized["torchao_int8_dynamic"]["seqbert"]
    model.save_pretrained(tmp_path / "folder")
    save_file({k: v.contiguous() for k, v in quantized["batch"].items()}, tmp_path / "inputs.safetensors")
    job = {"name": "q", "mode": "forward", "folder": str(tmp_path / "folder"), "auto_class": "AutoModel"}
    outputs = run_without_seqbert([{**job, "inputs": str(tmp_path / "inputs.safetensors")}], tmp_path)
    mask = quantized["batch"]["attention_mask"].bool()
    assert_close(outputs["q.last_hidden_state"][mask], before[mask], TOLERANCE)


def test_the_load_check_reads_quantized_weights_through_their_values(quantized):
    from seqbert.checkpoint_loading import non_finite_weights_error

    model, _ = quantized["torchao_int8_weight_only"]["seqbert"]
    assert non_finite_weights_error(model, "check") is None
    broken = copy.deepcopy(model)
    weight = broken.encoder.layers[2].mlp.up_proj.weight
    weight.scale.fill_(float("nan"))  # torchao's Int8Tensor: int8 values times a scale per row
    error = non_finite_weights_error(broken, "check")
    assert error is not None and "encoder.layers.2.mlp.up_proj.weight" in str(error)


# ----------------------------------------------------------------------------------------------------------------------
# Interpretability and adversarial training on the input embeddings
# ----------------------------------------------------------------------------------------------------------------------


def test_captum_layer_integrated_gradients_on_the_word_embeddings(folders, tokenizer, rt_texts):
    import captum.attr as captum_attr  # the test extra pins it: a missing one is an error, not a skip

    batch = tokenizer(rt_texts[20:24], padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # padded
    baselines = torch.full_like(batch["input_ids"], tokenizer.pad_token_id)
    attributions = {}
    for name, model in load_pair(folders, BertForSequenceClassification, {"num_labels": 2}).items():
        model.eval()

        def positive_logit(input_ids, attention_mask, model=model):
            return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 1]

        explainer = captum_attr.LayerIntegratedGradients(positive_logit, model.get_input_embeddings())
        attributions[name] = explainer.attribute(
            batch["input_ids"], baselines=baselines, additional_forward_args=(batch["attention_mask"],), n_steps=16
        ).sum(-1)  # (B, L)
    assert_close(attributions["seqbert"], attributions["bert"])


def test_adversarial_training_on_the_input_embeddings(folders, tokenizer, rt_texts):
    """FGM: the loss after moving the word embeddings along their gradient (epsilon times the unit gradient)."""
    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    labels = torch.tensor([0, 1, 1, 0])
    losses = {}
    for name, model in load_pair(folders, BertForSequenceClassification, {"num_labels": 2}, **NO_DROPOUT).items():
        model.train()
        model(**batch, labels=labels).loss.backward()
        embeddings = model.get_input_embeddings().weight
        with torch.no_grad():
            embeddings += 1.0 * embeddings.grad / embeddings.grad.norm()
            losses[name] = model(**batch, labels=labels).loss.item()
    assert losses["seqbert"] == pytest.approx(losses["bert"], abs=TOLERANCE)


# ----------------------------------------------------------------------------------------------------------------------
# Inputs and heads
# ----------------------------------------------------------------------------------------------------------------------


def test_inputs_embeds(folders, tokenizer, rt_texts):
    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    outputs = {}
    for name, model in load_pair(folders, BertModel).items():
        embeddings = model.get_input_embeddings()(batch["input_ids"])
        with torch.no_grad():
            outputs[name] = model.eval()(inputs_embeds=embeddings, attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    assert_close(outputs["seqbert"].last_hidden_state[mask], outputs["bert"].last_hidden_state[mask])


def test_multiple_choice(folders, tokenizer, rt_texts):
    prompts = [text for text in rt_texts[:2] for _ in range(3)]
    choices = rt_texts[10:16]
    encoded = tokenizer(prompts, choices, padding=True, return_tensors="pt")
    batch = {k: v.view(2, 3, -1) for k, v in encoded.items()}
    outputs = {}
    for name, model in load_pair(folders, BertForMultipleChoice).items():
        with torch.no_grad():
            outputs[name] = model.eval()(**batch, labels=torch.tensor([0, 2]))
    assert_close(outputs["seqbert"].logits, outputs["bert"].logits)
    assert abs(outputs["seqbert"].loss.item() - outputs["bert"].loss.item()) <= TOLERANCE


def test_resize_token_embeddings(folders, tokenizer, rt_texts):
    batch = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    batch["input_ids"][0, 1] = len(tokenizer) + 2  # one of the new tokens
    outputs = {}
    for name, model in load_pair(folders, BertForMaskedLM).items():
        torch.manual_seed(0)  # the new rows are drawn around the mean of the old ones
        model.resize_token_embeddings(len(tokenizer) + 5)
        with torch.no_grad():
            outputs[name] = model.eval()(**batch).logits
    mask = batch["attention_mask"].bool()
    assert outputs["seqbert"].shape[-1] == len(tokenizer) + 5
    assert_close(outputs["seqbert"][mask], outputs["bert"][mask])
