"""A user's subclass of a head keeps the head's loss, whatever the subclass is called (issue 66 item 1).

transformers derives `loss_type` from the class name (`Mine` matches none of `LOSS_MAPPING`'s patterns, so it was None
and `loss_function` fell back to the causal LM's shifted loss); seqbert's heads declare theirs (`head_loss_type`,
inherited). Each head is subclassed under a name that matches no pattern, given the base class's seeded weights, and
run on the same real Rotten Tomatoes snippets: the loss and every gradient equal the base class's bit for bit, eagerly
on the padded batch and, for the heads `StaticShapeCollator` lays out, through the CUDA-graph route's static batches.
"""

import pytest
import torch
from conftest import tiny_bert_vocab_config
from transformers import DataCollatorForMultipleChoice, DataCollatorForTokenClassification, DataCollatorWithPadding
from transformers.loss.loss_utils import LOSS_MAPPING

import seqbert
from seqbert.static_shapes import StaticShapeCollator


SNIPPETS = 6
MAX_LENGTH = 48


@pytest.fixture(scope="module")
def features(tokenizer, rt_texts) -> list[dict]:
    """Real snippets, tokenized unpadded, of mixed lengths."""
    return [dict(tokenizer(text, truncation=True, max_length=MAX_LENGTH)) for text in rt_texts[:SNIPPETS]]


def _sequence_labels(problem: str):
    generator = torch.Generator().manual_seed(0)
    return {
        "single_label": lambda: int(torch.randint(0, 3, (), generator=generator)),
        "regression_float": lambda: float(torch.randn((), generator=generator)),
        "regression_int": lambda: int(torch.randint(0, 5, (), generator=generator)),
        "multi_label_float": lambda: (torch.rand(3, generator=generator) < 0.5).float().tolist(),
        "multi_label_int": lambda: (torch.rand(3, generator=generator) < 0.5).long().tolist(),
    }[problem]


def _examples(name: str, features: list[dict]) -> list[dict]:
    """The examples of a head's task, with labels (`StaticShapeCollator`'s feature format)."""
    generator = torch.Generator().manual_seed(1)
    if name.startswith("sequence-"):
        label = _sequence_labels(name.removeprefix("sequence-"))
        return [{**f, "label": label()} for f in features]
    if name == "token":
        return [
            {**f, "labels": torch.randint(0, 5, (len(f["input_ids"]),), generator=generator).tolist()} for f in features
        ]
    if name == "qa":
        return [{**f, "start_positions": 1, "end_positions": min(3, len(f["input_ids"]) - 1)} for f in features]
    if name == "choice":
        pairs = [(features[2 * q], features[2 * q + 1]) for q in range(len(features) // 2)]
        return [
            {"input_ids": [a["input_ids"], b["input_ids"]], "token_type_ids": [a["token_type_ids"], b["token_type_ids"]],
             "label": q % 2}
            for q, (a, b) in enumerate(pairs)
        ]  # fmt: skip
    if name.startswith("mlm"):  # every third token labelled with its own id (a fixed masking, no randomness)
        return [{**f, "labels": [t if i % 3 == 1 else -100 for i, t in enumerate(f["input_ids"])]} for f in features]
    raise AssertionError(name)


# name: (head class, config overrides); "sequence-*" for every problem type of sequence classification.
ENCODER_HEADS = {
    **{
        f"sequence-{problem}": (
            seqbert.SeqBertForSequenceClassification,
            dict(
                num_labels=1 if problem.startswith("regression") else 3,
                problem_type="multi_label_classification" if problem == "multi_label_int" else None,
            ),
        )
        for problem in ("single_label", "regression_float", "regression_int", "multi_label_float", "multi_label_int")
    },
    "token": (seqbert.SeqBertForTokenClassification, dict(num_labels=5)),
    "qa": (seqbert.SeqBertForQuestionAnswering, {}),
    "choice": (seqbert.SeqBertForMultipleChoice, {}),
    "mlm-dense": (seqbert.SeqBertForMaskedLM, {}),
    "mlm-sparse": (seqbert.SeqBertForMaskedLM, dict(sparse_prediction=True)),
}


def _base_and_subclass(head_class, config):
    """The head and `Mine(head)`, a subclass whose name matches no loss pattern of transformers, with one set of
    seeded weights, in train mode."""
    torch.manual_seed(0)
    base = head_class(config).train()
    subclass = type("Mine", (head_class,), {"__module__": __name__})
    mine = subclass(config).train()
    mine.load_state_dict(base.state_dict())
    assert not any(pattern in "Mine" for pattern in LOSS_MAPPING)
    return base, mine


def _loss_and_gradients(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _check_equal(base, mine, base_batch: dict, mine_batch: dict) -> None:
    loss, grads = _loss_and_gradients(base, base_batch)
    mine_loss, mine_grads = _loss_and_gradients(mine, mine_batch)
    assert torch.isfinite(loss)
    torch.testing.assert_close(mine_loss, loss, atol=0, rtol=0)
    assert mine_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(mine_grads[name], grad, atol=0, rtol=0, msg=name)


def _padded_batch(tokenizer, name: str, examples: list[dict]) -> dict:
    """The padded batch transformers' collator of the task builds (to the longest example)."""
    if name in ("token", "mlm-dense", "mlm-sparse"):
        return dict(DataCollatorForTokenClassification(tokenizer)(examples))
    if name == "choice":
        return dict(DataCollatorForMultipleChoice(tokenizer)(examples))
    return dict(DataCollatorWithPadding(tokenizer)(examples))


@pytest.mark.parametrize("name", list(ENCODER_HEADS))
def test_a_subclassed_encoder_head_keeps_its_loss(tokenizer, features, name):
    head_class, overrides = ENCODER_HEADS[name]
    base, mine = _base_and_subclass(head_class, tiny_bert_vocab_config(**overrides))
    assert mine.loss_type == base.loss_type and mine.head_loss_type == base.head_loss_type
    examples = _examples(name, features)
    padded = _padded_batch(tokenizer, name, examples)
    _check_equal(base, mine, padded, padded)  # eagerly, on the padded batch
    # Through the route: the collator takes the subclass for its head's task, and lays the same batch out.
    static, mine_static = (
        StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)(examples) for model in (base, mine)
    )
    assert static.keys() == mine_static.keys() and static["static_layout"] is True
    for key, value in static.items():
        assert torch.equal(value, mine_static[key]) if torch.is_tensor(value) else value == mine_static[key], key
    _check_equal(base, mine, static, mine_static)
    assert base.config.problem_type == mine.config.problem_type


def test_a_subclassed_causal_lm_keeps_its_shifted_loss(tokenizer, features):
    """The causal LM was the silent case: `Mine`'s loss took the unshifted labels (10.2988 against 10.2945 in the
    report)."""
    base, mine = _base_and_subclass(seqbert.SeqBertForCausalLM, tiny_bert_vocab_config(is_decoder=True))
    batch = dict(DataCollatorWithPadding(tokenizer)(features))
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    _check_equal(base, mine, batch, batch)


def test_a_subclassed_seq2seq_model_keeps_its_loss(tokenizer, features):
    base, mine = _base_and_subclass(
        seqbert.SeqBertForConditionalGeneration,
        tiny_bert_vocab_config(is_encoder_decoder=True, decoder_start_token_id=101),
    )
    sources = dict(DataCollatorWithPadding(tokenizer)(features[:3]))
    targets = dict(DataCollatorWithPadding(tokenizer)(features[3:]))
    batch = {**sources, "labels": targets["input_ids"].masked_fill(targets["attention_mask"] == 0, -100)}
    batch.pop("token_type_ids")
    _check_equal(base, mine, batch, batch)


def test_a_subclass_named_like_another_head_keeps_its_own_heads_loss(tokenizer, features):
    """The loss follows the class a model derives from, not its name: a question-answering head called
    `MyForCausalLM` (transformers would take the causal LM's loss by the name) keeps the span loss."""
    torch.manual_seed(0)
    base = seqbert.SeqBertForQuestionAnswering(tiny_bert_vocab_config()).train()
    misnamed = type("MyForCausalLM", (seqbert.SeqBertForQuestionAnswering,), {})(tiny_bert_vocab_config()).train()
    misnamed.load_state_dict(base.state_dict())
    assert misnamed.loss_type == "ForQuestionAnswering"
    batch = dict(DataCollatorWithPadding(tokenizer)(_examples("qa", features)))
    _check_equal(base, misnamed, batch, batch)
