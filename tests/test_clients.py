"""The client suite: what a BERT user does with BERT in the libraries paired with transformers, done once with
transformers' own BERT classes and once with SeqBERT converted from the same folder, and the results compared.

Every flow loads both models from one saved folder (the real MiniLM-L6 checkpoint with a seeded head), runs on real
Rotten Tomatoes snippets, and asserts equal results within fp32 parity (BERT's and SeqBERT's products are summed in
another order on padded batches, see docs/testing.md).

- `Trainer(neftune_noise_alpha=5)` (NEFTune, Jain et al. 2023): the noise hook on `get_input_embeddings()` sees BERT's
  (B, L, H), so its bound alpha / sqrt(L H) and its draws are BERT's, and the first losses equal BERT's.
- captum's `LayerIntegratedGradients` on the word embeddings of a padded batch: BERT's attributions.
"""

import pytest
import torch
from transformers import (
    BertForSequenceClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import seqbert


# The difference between BERT's and SeqBERT's fp32 results on these inputs (their products sum in another order).
TOLERANCE = 1e-5
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory, minilm_path, tokenizer):
    """MiniLM-L6 with a seeded 2-class head, saved as a BertForSequenceClassification folder."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("minilm_classifier")
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_pair(folder, **overrides) -> dict[str, torch.nn.Module]:
    """transformers' BERT classifier and SeqBERT's, from the same folder, with the same config overrides."""
    return {
        "bert": BertForSequenceClassification.from_pretrained(folder, **overrides),
        "seqbert": seqbert.SeqBertForSequenceClassification.from_bert_pretrained(folder, **overrides),
    }


# ----------------------------------------------------------------------------------------------------------------------
# Trainer options
# ----------------------------------------------------------------------------------------------------------------------


class EmbeddingNoise(TrainerCallback):
    """Records, at each training step, the input embeddings before and after NEFTune's hook: a forward hook on the
    embedding layer registered before NEFTune's (it sees the clean output) and one after (the noisy one)."""

    def __init__(self, model):
        self.clean, self.noisy = [], []
        model.get_input_embeddings().register_forward_hook(lambda m, args, out: self.clean.append(out.detach()))

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # NEFTune's hook is on by then
        model.get_input_embeddings().register_forward_hook(lambda m, args, out: self.noisy.append(out.detach()))


def test_neftune_adds_berts_noise(classifier_folder, tokenizer, rt_texts, tmp_path):
    features = [{**tokenizer(text), "labels": i % 2} for i, text in enumerate(rt_texts[:8])]
    runs = {}
    for name, model in load_pair(classifier_folder, **NO_DROPOUT).items():
        arguments = TrainingArguments(
            output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
            neftune_noise_alpha=5, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        )  # fmt: skip
        noise = EmbeddingNoise(model)
        trainer = Trainer(
            model,
            arguments,
            train_dataset=features,
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[noise],
        )
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        runs[name] = noise, losses
    (bert, bert_losses), (mine, mine_losses) = runs["bert"], runs["seqbert"]
    assert [x.shape for x in mine.noisy] == [x.shape for x in bert.noisy]  # (B, L, H): padded batches of 4
    assert len(mine.noisy) == 2 and mine.noisy[0].shape[0] == 4
    for clean, noisy, bert_clean, bert_noisy in zip(mine.clean, mine.noisy, bert.clean, bert.noisy, strict=True):
        bound = 5 / (noisy.shape[1] * noisy.shape[2]) ** 0.5  # NEFTune: alpha / sqrt(L * H)
        assert (noisy - clean).abs().max().item() <= bound
        torch.testing.assert_close(noisy - clean, bert_noisy - bert_clean)  # the same draws
    assert mine_losses == pytest.approx(bert_losses, abs=TOLERANCE), (mine_losses, bert_losses)


# ----------------------------------------------------------------------------------------------------------------------
# Interpretability: captum
# ----------------------------------------------------------------------------------------------------------------------


def test_captum_layer_integrated_gradients_on_the_word_embeddings(classifier_folder, tokenizer, rt_texts):
    captum_attr = pytest.importorskip("captum.attr", reason="captum is in the test extra: pip install -e '.[test]'")
    batch = tokenizer(rt_texts[20:24], padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # padded
    baselines = torch.full_like(batch["input_ids"], tokenizer.pad_token_id)
    attributions = {}
    for name, model in load_pair(classifier_folder).items():
        model.eval()

        def positive_logit(input_ids, attention_mask, model=model):
            return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 1]

        explainer = captum_attr.LayerIntegratedGradients(positive_logit, model.get_input_embeddings())
        attributions[name] = explainer.attribute(
            batch["input_ids"], baselines=baselines, additional_forward_args=(batch["attention_mask"],), n_steps=16
        ).sum(-1)  # (B, L)
    scale = attributions["bert"].abs().max().item()
    assert attributions["seqbert"].shape == attributions["bert"].shape
    assert (attributions["seqbert"] - attributions["bert"]).abs().max().item() <= TOLERANCE * max(scale, 1.0)
