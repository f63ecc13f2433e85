"""`StaticShapeCollator`: batches in a few fixed shapes, whose forward and backward read nothing on the host, for CUDA
graphs (`torch.compile(mode="reduce-overhead")`). Checked on the CPU, where no GPU is:

- every head that trains with `Trainer` gives, on the collator's static batch, the logits, loss and gradients of the
  tokenizer-padded batch of the same real snippets, in fp32 (<= 1e-6), through the sdpa path and the eager reference;
- an epoch of the main job's data (2,000 Rotten Tomatoes snippets, batch 32, 128 tokens) takes at most the ladder's
  number of distinct shapes, each a bucket of the ladder;
- `torch.compile(fullgraph=True, dynamic=False)` of a tiny model's training step compiles at most once per bucket over
  that epoch (dynamo's own counters), and not at all again in a second pass;
- a batch beyond the ladder is padded as usual, warned about once, and run eagerly by a compiled model (no graph);
- planted faults fail: a shape outside the ladder reaching a graph, a forward that reads the host.

The host reads and the flash kernel's arguments on a GPU are checked by the CUDA dry run (`test_cuda_dry_run.py`).
"""

import math
import warnings
from dataclasses import replace
from unittest import mock

import pytest
import torch
from conftest import tiny_config
from transformers import (
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

import seqbert
from seqbert import attention_backends, input_checks
from seqbert.data import load_rotten_tomatoes
from seqbert.static_shapes import Bucket, StaticShapeCollator, token_ladder


TOLERANCE = 1e-6
SNIPPETS = 12


def _config(**overrides) -> seqbert.SeqBertConfig:
    """BERT's vocabulary (the snippets' tokenizer), 2 layers of 32, no dropout (the two batches draw none)."""
    settings = dict(
        vocab_size=30522,
        max_position_embeddings=128,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return tiny_config(**(settings | overrides))


def _pair(model_class, config):
    torch.manual_seed(0)
    return model_class(config).train()


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _run(model, batch: dict):
    model.zero_grad()
    output = model(**batch)
    output.loss.backward()
    return output, _grads(model)


def _check_grads(static: dict, plain: dict) -> None:
    assert static.keys() == plain.keys() and static
    worst = max((static[name] - plain[name]).abs().max().item() for name in plain)
    assert worst <= TOLERANCE, worst


def _snippet_features(tokenizer, rt_texts) -> list[dict]:
    return [dict(tokenizer(text, truncation=True, max_length=64)) for text in rt_texts[:SNIPPETS]]


@pytest.fixture(scope="module")
def features(tokenizer, rt_texts) -> list[dict]:
    """12 real snippets, tokenized unpadded (7 to 40 tokens), with segment ids."""
    features = _snippet_features(tokenizer, rt_texts)
    lengths = [len(f["input_ids"]) for f in features]
    assert min(lengths) < max(lengths) // 2
    return features


def _real_rows(batch: dict) -> torch.Tensor:
    """The flat positions of a padded batch's real tokens, in order."""
    return batch["attention_mask"].reshape(-1).nonzero().squeeze(1)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("problem", ["single_label_classification", "regression", "multi_label_classification"])
def test_sequence_classification(tokenizer, features, problem, attn_implementation):
    generator = torch.Generator().manual_seed(0)
    num_labels = 1 if problem == "regression" else 3
    if problem == "single_label_classification":
        labels = torch.randint(0, 3, (SNIPPETS,), generator=generator).tolist()
        labels[3] = -100  # ignored, as in a padded batch
    elif problem == "regression":
        labels = torch.randn(SNIPPETS, generator=generator).tolist()
    else:
        labels = (torch.rand(SNIPPETS, 3, generator=generator) < 0.5).float().tolist()
    examples = [{**f, "label": label} for f, label in zip(features, labels, strict=True)]
    config = _config(num_labels=num_labels, problem_type=problem, attn_implementation=attn_implementation)
    model = _pair(seqbert.SeqBertForSequenceClassification, config)
    collator = StaticShapeCollator(tokenizer, model, max_length=64)
    static = collator(examples)
    assert static["static_layout"] is True and static["labels"].shape[0] == static["cu_seq_lens_q"].numel() - 1
    plain = DataCollatorWithPadding(tokenizer)(examples)
    static_output, static_grads = _run(model, static)
    plain_output, plain_grads = _run(model, plain)
    assert static_output.logits.shape == (static["cu_seq_lens_q"].numel() - 1, num_labels)
    torch.testing.assert_close(static_output.logits[:SNIPPETS], plain_output.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(static_output.loss, plain_output.loss, atol=TOLERANCE, rtol=0)
    _check_grads(static_grads, plain_grads)


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_token_classification(tokenizer, features, norm_placement):
    generator = torch.Generator().manual_seed(1)
    examples = []
    for f in features:
        labels = torch.randint(0, 5, (len(f["input_ids"]),), generator=generator)
        labels[0] = labels[-1] = -100  # [CLS] and [SEP], as word-aligned labels leave them
        examples.append({**f, "labels": labels.tolist()})
    model = _pair(seqbert.SeqBertForTokenClassification, _config(num_labels=5, norm_placement=norm_placement))
    static = StaticShapeCollator(tokenizer, model, max_length=64)(examples)
    plain = DataCollatorForTokenClassification(tokenizer)(examples)
    static_output, static_grads = _run(model, static)
    plain_output, plain_grads = _run(model, plain)
    real = sum(len(f["input_ids"]) for f in features)
    torch.testing.assert_close(
        static_output.logits[0, :real], plain_output.logits.reshape(-1, 5)[_real_rows(plain)], atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(static_output.loss, plain_output.loss, atol=TOLERANCE, rtol=0)
    _check_grads(static_grads, plain_grads)


@pytest.mark.parametrize("sparse_prediction", [False, True], ids=["dense", "sparse"])
def test_masked_lm(tokenizer, features, sparse_prediction):
    """The same masked positions in both batches (the examples carry their labels)."""
    generator = torch.Generator().manual_seed(2)
    examples = []
    for f in features:
        ids = torch.tensor(f["input_ids"])
        chosen = torch.rand(len(ids), generator=generator) < 0.15
        chosen[1] = True
        chosen[0] = chosen[-1] = False
        examples.append(
            {**f, "input_ids": ids.masked_fill(chosen, 103).tolist(), "labels": ids.masked_fill(~chosen, -100).tolist()}
        )
    model = _pair(seqbert.SeqBertForMaskedLM, _config(sparse_prediction=sparse_prediction))
    static = StaticShapeCollator(tokenizer, model, max_length=64)(examples)
    plain = DataCollatorForTokenClassification(tokenizer)(examples)  # pads labels with -100, as masked LM's collator
    labelled = int((plain["labels"] != -100).sum())
    assert static["max_predictions"] >= labelled
    static_output, static_grads = _run(model, static)
    plain_output, plain_grads = _run(model, plain)
    if sparse_prediction:
        assert static_output.logits.shape == (static["max_predictions"], 30522)
        torch.testing.assert_close(static_output.logits[:labelled], plain_output.logits, atol=TOLERANCE, rtol=0)
    else:
        real = sum(len(f["input_ids"]) for f in features)
        rows = plain_output.logits.reshape(-1, 30522)[_real_rows(plain)]
        torch.testing.assert_close(static_output.logits[0, :real], rows, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(static_output.loss, plain_output.loss, atol=TOLERANCE, rtol=0)
    _check_grads(static_grads, plain_grads)


def test_question_answering(tokenizer, features):
    """Start and end logits laid out per sequence as the padded batch holds them (its padding's logits up to the
    longest snippet); a position beyond a snippet but within the longest, and one beyond the longest (ignored)."""
    generator = torch.Generator().manual_seed(3)
    longest = max(len(f["input_ids"]) for f in features)
    examples = []
    for i, f in enumerate(features):
        start = int(torch.randint(1, len(f["input_ids"]) - 1, (), generator=generator))
        end = min(start + 2, len(f["input_ids"]) - 1)
        if i == 2:
            end = longest - 1 if len(f["input_ids"]) < longest else end  # a padding position of the padded batch
        if i == 5:
            start = longest + 3  # beyond every sequence: ignored
        examples.append({**f, "start_positions": start, "end_positions": end})
    model = _pair(seqbert.SeqBertForQuestionAnswering, _config(num_labels=2))
    static = StaticShapeCollator(tokenizer, model, max_length=64)(examples)
    plain = DataCollatorWithPadding(tokenizer)(examples)
    static_output, static_grads = _run(model, static)
    plain_output, plain_grads = _run(model, plain)
    for side in ("start_logits", "end_logits"):
        torch.testing.assert_close(
            getattr(static_output, side)[:SNIPPETS, :longest], getattr(plain_output, side), atol=TOLERANCE, rtol=0
        )
    torch.testing.assert_close(static_output.loss, plain_output.loss, atol=TOLERANCE, rtol=0)
    _check_grads(static_grads, plain_grads)


def test_multiple_choice(tokenizer, features):
    """Six questions of two choices each (consecutive snippets)."""
    examples = [
        {
            "input_ids": [features[2 * q]["input_ids"], features[2 * q + 1]["input_ids"]],
            "token_type_ids": [features[2 * q]["token_type_ids"], features[2 * q + 1]["token_type_ids"]],
            "label": q % 2,
        }
        for q in range(SNIPPETS // 2)
    ]
    model = _pair(seqbert.SeqBertForMultipleChoice, _config())
    static = StaticShapeCollator(tokenizer, model, max_length=64)(examples)
    assert static["num_choices"] == 2 and (static["cu_seq_lens_q"].numel() - 1) % 2 == 0
    plain = DataCollatorForMultipleChoice(tokenizer)(examples)
    static_output, static_grads = _run(model, static)
    plain_output, plain_grads = _run(model, plain)
    torch.testing.assert_close(static_output.logits[: SNIPPETS // 2], plain_output.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(static_output.loss, plain_output.loss, atol=TOLERANCE, rtol=0)
    _check_grads(static_grads, plain_grads)


def test_the_encoder_pools_each_sequence(tokenizer, features):
    """`SeqBertModel` on a static batch: the packed row's hidden states are the padded batch's real tokens', and
    `pooler_output` holds one row per sequence slot."""
    model = _pair(seqbert.SeqBertModel, _config()).eval()
    static = StaticShapeCollator(tokenizer, model.config, max_length=64)(features)
    plain = DataCollatorWithPadding(tokenizer)(features)
    with torch.no_grad():
        static_output, plain_output = model(**static), model(**plain)
    real = sum(len(f["input_ids"]) for f in features)
    hidden = plain_output.last_hidden_state.reshape(-1, 32)[_real_rows(plain)]
    torch.testing.assert_close(static_output.last_hidden_state[0, :real], hidden, atol=TOLERANCE, rtol=0)
    assert static_output.pooler_output.shape == (static["cu_seq_lens_q"].numel() - 1, 32)
    torch.testing.assert_close(
        static_output.pooler_output[:SNIPPETS], plain_output.pooler_output, atol=TOLERANCE, rtol=0
    )


def test_the_collators_masking_bounds_the_predictions(tokenizer, features):
    """Without labels in the examples, masked LM's labels come from transformers' masking; `max_predictions` bounds
    them, and the sparse head's loss equals the dense head's on the same batch."""
    torch.manual_seed(4)
    config = _config(sparse_prediction=True)
    model = _pair(seqbert.SeqBertForMaskedLM, config)
    collator = StaticShapeCollator(tokenizer, model, max_length=64, mlm_probability=0.3)
    batch = collator(features)
    labelled = int((batch["labels"] != -100).sum())
    assert 0 < labelled <= batch["max_predictions"]
    assert (batch["input_ids"][batch["labels"] != -100] != batch["labels"][batch["labels"] != -100]).any()
    dense = _pair(seqbert.SeqBertForMaskedLM, _config(sparse_prediction=False))
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).loss, dense(**batch).loss, atol=TOLERANCE, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# The ladder over an epoch of the main job's data
# ----------------------------------------------------------------------------------------------------------------------

BATCH = 32
MAX_LENGTH = 128


@pytest.fixture(scope="module")
def main_job_epoch(tokenizer) -> list[list[dict]]:
    """The main job's training data (`run_classification.py`'s defaults: 2,000 Rotten Tomatoes snippets, truncated to
    128 tokens) in batches of 32, in file order."""
    train = load_rotten_tomatoes()["train"]
    encoded = tokenizer(list(train["text"]), truncation=True, max_length=MAX_LENGTH)
    examples = [
        {"input_ids": ids, "token_type_ids": types, "label": label}
        for ids, types, label in zip(encoded["input_ids"], encoded["token_type_ids"], train["label"], strict=True)
    ]
    return [examples[start : start + BATCH] for start in range(0, len(examples), BATCH)]


def _shape(batch: dict) -> tuple[int, int]:
    return batch["input_ids"].shape[1], batch["cu_seq_lens_q"].numel() - 1


def test_the_ladder_grows_geometrically():
    assert token_ladder(1000) == [64, 128, 192, 256, 320, 448, 576, 768, 960, 1216]
    with pytest.raises(ValueError, match=r"growth \(1.0\) must be > 1"):
        token_ladder(1000, growth=1.0)


def test_an_epoch_takes_at_most_the_ladders_shapes(tokenizer, main_job_epoch):
    collator = StaticShapeCollator(tokenizer, _config(num_labels=2), max_length=MAX_LENGTH, batch_size=BATCH)
    ladder = {(bucket.tokens, bucket.sequences) for bucket in collator.ladder(BATCH)}
    shapes = [_shape(collator(batch)) for batch in main_job_epoch]
    assert set(shapes) <= ladder
    assert len(set(shapes)) <= len(ladder)
    # The epoch's 63 batches (the last of 16 snippets) visit a handful of buckets: about 860 tokens a batch.
    assert len(set(shapes)) <= 5, sorted(set(shapes))
    padding = sum(t for t, _ in shapes) / sum(len(e["input_ids"]) for batch in main_job_epoch for e in batch) - 1
    assert padding < 0.25


# What reads a value on the host, or makes a shape of values, in a graph dynamo captured (a sync on a GPU).
HOST_READS = {"item", "tolist", "nonzero", "unique", "masked_select", "_local_scalar_dense"}


class RecordingBackend:
    """A `torch.compile` backend that keeps every graph dynamo captures and runs it through AOTAutograd
    (`aot_eager`: forward and backward traced, no code generated)."""

    def __init__(self):
        self.graphs = []
        self.aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module)
        return self.aot_eager(graph_module, example_inputs)


def host_reads(graph_module) -> list[str]:
    """The nodes of a captured graph that read values on the host, by name."""
    names = (getattr(node.target, "__name__", str(node.target)) for node in graph_module.graph.nodes)
    return [name for name in names if name in HOST_READS]


def check_compiled_shapes(batches: list[dict], ladder: list[Bucket], step, backend: RecordingBackend) -> dict[str, int]:
    """Runs `step` (compiled with `backend`) over `batches` and returns dynamo's counters: raises `AssertionError`
    where a batch's shape is not a bucket of `ladder` (it would reach a compiled graph of its own), where the step
    compiled more than once per bucket (a guard on a value that changes from batch to batch would recompile), or
    where a captured graph reads the host."""
    allowed = {(bucket.tokens, bucket.sequences) for bucket in ladder}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend.graphs.clear()
    for batch in batches:
        if _shape(batch) not in allowed:
            raise AssertionError(
                f"a batch of shape {_shape(batch)} reached the compiled step; the ladder has {sorted(allowed)}"
            )
        step(batch)
    first = dict(torch._dynamo.utils.counters["stats"])
    shapes = {_shape(batch) for batch in batches}
    if first["unique_graphs"] > len(shapes):
        raise AssertionError(f"{first['unique_graphs']} graphs compiled for {len(shapes)} buckets")
    reads = [read for graph in backend.graphs for read in host_reads(graph)]
    if reads:
        raise AssertionError(f"the captured step reads the host: {reads}")
    return first


@pytest.fixture(scope="module")
def compiled_epoch(tokenizer, main_job_epoch):
    """The epoch through the collator, and a tiny sequence classifier (one head: the CPU's attention layout is the
    step's cost) whose training step (forward, loss, backward) is compiled with `fullgraph=True, dynamic=False`
    (AOTAutograd traces the backward; `aot_eager` runs the traced graphs without generating code)."""
    model = _pair(seqbert.SeqBertForSequenceClassification, _config(num_labels=2, num_attention_heads=1))
    collator = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH, batch_size=BATCH)
    batches = [collator(batch) for batch in main_job_epoch]
    backend = RecordingBackend()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)

    def step(batch):
        loss = forward(**batch).loss
        loss.backward()
        return loss

    return batches, collator.ladder(BATCH), step, backend


def test_a_compiled_training_step_compiles_once_per_bucket(compiled_epoch):
    batches, ladder, step, backend = compiled_epoch
    counters = check_compiled_shapes(batches, ladder, step, backend)
    assert counters["unique_graphs"] == len({_shape(b) for b in batches}) >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_shape_outside_the_ladder_reaching_the_graph_fails(compiled_epoch, tokenizer):
    """Planted: a static batch one filler token longer than its bucket (a collator that rounded wrongly)."""
    batches, ladder, step, backend = compiled_epoch
    wrong = dict(batches[0])
    wrong["input_ids"] = torch.cat([wrong["input_ids"], torch.zeros(1, 1, dtype=torch.long)], dim=1)
    with pytest.raises(AssertionError, match="reached the compiled step"):
        check_compiled_shapes([batches[0], wrong], ladder, step, backend)


def test_a_host_read_in_the_step_fails(compiled_epoch):
    """Planted: the forward reads `max_seqlen` from the device (`.item()`, as the plain path's one read does) instead
    of taking the batch's bound. Captured into the graph it would be a sync on a GPU (and no CUDA graph): the check
    finds it; where its value sets a shape, dynamo refuses the data-dependent shape in a full graph. The CUDA dry run
    counts the same read as a host sync."""
    batches, ladder, step, backend = compiled_epoch
    original = seqbert.modeling_seqbert.SeqBertModel._attention_layout

    def reading(self, unpadded, *args):
        return original(self, replace(unpadded, max_seqlen=int(unpadded.cu_seqlens.diff().max().item())), *args)

    with mock.patch.object(seqbert.modeling_seqbert.SeqBertModel, "_attention_layout", reading):
        with pytest.raises((AssertionError, torch._dynamo.exc.UserError), match="reads the host|data-dependent"):
            check_compiled_shapes(batches[:1], ladder, step, backend)
    unused = seqbert.modeling_seqbert.SeqBertModel._attention_layout

    def reading_aside(self, unpadded, *args):
        return unused(
            self, replace(unpadded, max_seqlen=unpadded.max_seqlen + 0 * int(unpadded.cu_seqlens[-1].item())), *args
        )

    with mock.patch.object(seqbert.modeling_seqbert.SeqBertModel, "_attention_layout", reading_aside):
        with pytest.raises(AssertionError, match=r"the captured step reads the host: \['item'\]"):
            check_compiled_shapes(batches[:1], ladder, step, backend)


def stand_in_flash_attention(query, key, value, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, debug, scale=None):
    """What `aten._flash_attention_forward` computes (no dropout), from the same arguments, with torch's CPU sdpa on
    a block-diagonal mask built from `cu_q` on the device: the CUDA branch's stand-in on a CPU. `max_q` / `max_k` must
    be ints, as the kernel takes them (a traced value would make them symbolic)."""
    assert type(max_q) is int and type(max_k) is int and max_q == max_k and not dropout_p
    tokens = torch.arange(query.shape[0])
    sequence = torch.searchsorted(cu_q[1:].long(), tokens, right=True)
    mask = sequence[:, None] == sequence[None, :]  # (T, T)
    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # (1, N, T, D)
    output = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return (output[0].transpose(0, 1),)  # (T, N, D)


def test_the_cuda_branch_compiles_in_one_graph_per_bucket(compiled_epoch, tokenizer, features):
    """The GPU path (variable-length attention on `cu_seqlens`, no attention layout), forced on the CPU with a stand-in
    for the flash kernel: compiled with `fullgraph=True, dynamic=False`, a training step compiles once per bucket and
    its captured graphs read nothing on the host (over two buckets of the epoch); its logits are the padded batch's."""
    batches, ladder, _, _ = compiled_epoch
    first_of_each = {_shape(batch): batch for batch in reversed(batches)}
    batches = list(first_of_each.values())[:2]
    # As the fixture's collator set it on its model's config (the batches are that collator's).
    model = _pair(
        seqbert.SeqBertForSequenceClassification, _config(num_labels=2, problem_type="single_label_classification")
    )
    backend = RecordingBackend()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)

    def step(batch):
        forward(**batch).loss.backward()

    with (
        mock.patch.object(seqbert.modeling_seqbert, "varlen_attention_applies", lambda *args: True),
        mock.patch.object(seqbert.modeling_seqbert, "varlen_attention_fits", lambda *args: True),
        mock.patch.object(attention_backends, "flash_attention_forward", stand_in_flash_attention),
    ):
        counters = check_compiled_shapes(batches, ladder, step, backend)
        assert counters["unique_graphs"] == len({_shape(b) for b in batches})
        examples = [{**f, "label": 1} for f in features]
        static = StaticShapeCollator(tokenizer, model, max_length=64)(examples)
        with torch.no_grad():
            logits = forward(**static).logits[:SNIPPETS]
    with torch.no_grad():
        plain = model(**DataCollatorWithPadding(tokenizer)(examples)).logits
    torch.testing.assert_close(logits, plain, atol=TOLERANCE, rtol=0)


def test_a_static_batch_reads_nothing_on_the_host(tokenizer, features):
    """Eagerly too: the forward and backward of a static batch never call `read_on_host` (the checks' one read)."""
    model = _pair(seqbert.SeqBertForSequenceClassification, _config(num_labels=2))
    batch = StaticShapeCollator(tokenizer, model, max_length=64)([{**f, "label": 1} for f in features])
    with mock.patch.object(input_checks, "read_on_host", side_effect=AssertionError("read")) as read:
        with mock.patch.object(seqbert.modeling_seqbert, "read_on_host", read):
            model(**batch).loss.backward()
    assert not read.called


# ----------------------------------------------------------------------------------------------------------------------
# Beyond the ladder, and bad input
# ----------------------------------------------------------------------------------------------------------------------


def test_a_batch_beyond_the_ladder_runs_eagerly_with_one_warning(tokenizer, features):
    """Snippets longer than `max_length`: padded as usual, marked `static_layout=False`, one warning for two such
    batches; a compiled model runs them outside its graph (no graph holds an op), with the eager model's outputs."""
    model = _pair(seqbert.SeqBertForSequenceClassification, _config(num_labels=2)).eval()
    examples = [{**f, "label": 1} for f in features]
    collator = StaticShapeCollator(tokenizer, model, max_length=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [collator(examples[:6]), collator(examples[6:])]
    assert [str(w.message).count("longer than max_length (16)") for w in caught] == [1]
    assert collator.beyond_ladder == 2 and all(b["static_layout"] is False and "attention_mask" in b for b in batches)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(compiled(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    assert counter.op_count == 0


def test_the_collator_raises_what_the_forward_raises(tokenizer, features):
    model = _pair(seqbert.SeqBertForSequenceClassification, _config(num_labels=2))
    collator = StaticShapeCollator(tokenizer, model, max_length=64)
    with pytest.raises(ValueError, match=r"labels holds 7 at index \(1,\); allowed: \[0, num_labels=2\) or -100"):
        collator([{**features[0], "label": 0}, {**features[1], "label": 7}])
    with pytest.raises(ValueError, match=r"input_ids holds 40000 at index \(0, 1\); allowed: \[0, vocab_size=30522\)"):
        collator([{**features[0], "input_ids": [101, 40000, 102], "token_type_ids": [0, 0, 0], "label": 0}])
    padded = dict(tokenizer(["a film"], padding="max_length", max_length=8))
    with pytest.raises(ValueError, match="takes examples unpadded"):
        collator([{k: v[0] for k, v in padded.items()} | {"label": 0}])
    with pytest.raises(ValueError, match="empty batch"):
        collator([])
    with pytest.raises(TypeError, match="must be a SeqBERT model"):
        StaticShapeCollator(tokenizer, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"max_length \(512\) exceeds max_position_embeddings \(128\)"):
        StaticShapeCollator(tokenizer, model, max_length=512)


def test_the_forward_refuses_an_incomplete_static_batch(tokenizer, features):
    model = _pair(seqbert.SeqBertModel, _config())
    batch = StaticShapeCollator(tokenizer, model.config, max_length=64)(features)
    with pytest.raises(ValueError, match="static_layout=True needs cu_seq_lens_q"):
        model(**{k: v for k, v in batch.items() if k != "max_length_q"})
    with pytest.raises(TypeError, match="cu_seq_lens_q must be int32"):
        model(**(batch | {"cu_seq_lens_q": batch["cu_seq_lens_q"].long()}))
    with pytest.raises(ValueError, match="takes no attention_mask"):
        model(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
    mlm = _pair(seqbert.SeqBertForMaskedLM, _config(sparse_prediction=True))
    labels = batch["input_ids"].masked_fill(batch["position_ids"] != 1, -100)
    with pytest.raises(ValueError, match="needs max_predictions"):
        mlm(**batch, labels=labels)
    choice = _pair(seqbert.SeqBertForMultipleChoice, _config())
    with pytest.raises(ValueError, match="needs num_choices, an int >= 1"):
        choice(**batch)
    with pytest.raises(ValueError, match=r"num_choices \(7\) must divide the static batch's"):
        choice(**batch, num_choices=7)


def test_buckets_hold_their_fill(tokenizer):
    """Every bucket has room for the filler sequences its largest fill needs, and the chosen bucket is the smallest
    that holds the batch."""
    collator = StaticShapeCollator(tokenizer, _config(), max_length=32, batch_size=4)
    ladder = collator.ladder(4)
    previous = 0
    for bucket in ladder:
        assert bucket.sequences >= 4 + math.ceil((bucket.tokens - previous) / 32)
        previous = bucket.tokens
    assert collator.bucket([32, 32, 32, 32]) == ladder[1]  # 128 tokens
    assert collator.bucket([32, 32, 32, 33]) is None
    assert collator.bucket([1]).tokens == 64
