"""The CUDA dry run: seqbert's CUDA code executed in every CI run, on a CPU, on fake CUDA tensors (`fake_cuda.py`).

Each flow builds the model on one fake GPU (an H100, compute capability 9.0, unless the flow says otherwise), feeds it
real Rotten Tomatoes snippets through the MiniLM tokenizer, runs the forward (and the backward of a training step,
with labels and BERT's attention dropout 0.1) through torch's real meta kernels, and asserts:

- outputs, loss and gradients are CUDA tensors; no op mixed devices (FakeTensorMode raises) and no tensor of one or
  more dimensions was created on the CPU inside the path (`fake_cuda.CudaPathCheck`);
- the variable-length flash kernel ran once a layer forward and once backward where the path applies (zero where the
  fallback or the padded decoder runs), every call within the kernel's argument contract, and told the batch's
  sequences as the kernel trusts them: T, S and `max_seqlen_q` / `max_seqlen_k` equal to those the harness computes
  from the batch's mask itself (`fake_cuda.SequenceLayout`), which the layout the CPU run of the same batch computed
  (`UnpaddedBatch.from_mask`, `cu_seqlens` values included) must equal too;
- which sdpa kernel ran, as sdpa picks it on the fake GPU (`fake_cuda.sdpa_kernel`), and how often (none where the
  variable-length kernel runs);
- the host was synced once per forward or training step: every read of a CUDA tensor's value, every copy from the
  device to the host and every blocking copy from the host to the device counts (the reads are served from a CPU run
  of the same batch: a read the CPU run did not make, or made from another call site, fails).

Flows: an inference forward; the training step of every head (sequence and token classification, question answering,
multiple choice, sparse masked LM, causal LM, seq2seq); packed rows from `DataCollatorWithFlattening` with and without
`cu_seq_lens_q`; gradient checkpointing; fp16 and bf16 weights; fp32 weights under bf16 autocast (what
`Trainer(bf16=True)` runs); the fallback (projections returning another dtype); pre-LN and post-LN; the seq2seq
decoder's cached step; and the kernel's entry conditions crossed (head size not a multiple of 8, above 256, a compute
capability 7.5 GPU, fp32 weights without autocast), each sent to sdpa. Then the planted faults the dry run must catch:
a CPU tensor inside the path, int64 `cu_seqlens`, a key of another dtype, fp32 queries, a query with a strided last
dimension, `max_seqlen` one too small, a sequence missing from `cu_seqlens`, a second host read, a read only the CUDA
branch makes, the same read made from another call site, a 0-dim `.cpu()`, a CUDA tensor built from host data, a
`torch.cuda.synchronize()`, and training sent to the fallback.

Needs a C++ compiler for the fake device (`fake_cuda_shim.py`): without one the module skips, naming what is missing;
CI sets `SEQBERT_REQUIRE_CUDA_DRY_RUN=1`, under which a skip is a failure. The real GPU tests are `tests/test_cuda.py`.
"""

import contextlib
import dataclasses
from unittest import mock

import fake_cuda
import fake_cuda_shim
import pytest
import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import send_to_device
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithFlattening,
    Trainer,
    TrainingArguments,
)

import seqbert
from seqbert import attention_backends
from seqbert.attention_backends import UnpaddedBatch
from seqbert.static_shapes import StaticShapeCollator, training_arguments
from seqbert.transformers_compat import CACHE_NAME


if fake_cuda_shim.unavailable is not None:
    if fake_cuda_shim.required():
        raise RuntimeError(
            f"{fake_cuda_shim.REQUIRED_VARIABLE} is set, but the CUDA dry run cannot run: {fake_cuda_shim.unavailable}"
        )
    pytest.skip(fake_cuda_shim.unavailable, allow_module_level=True)


LAYERS = 2

# The backward op of each sdpa kernel (`fake_cuda.sdpa_kernel`); the math path has none of its own.
SDPA_BACKWARD = {
    "flash": "aten._scaled_dot_product_flash_attention_backward.default",
    "efficient": "aten._scaled_dot_product_efficient_attention_backward.default",
}


def tiny_config(**overrides) -> seqbert.SeqBertConfig:
    """bert-base-uncased's vocabulary (the snippets' tokenizer), 2 layers of hidden 64 in 4 heads of 16, BERT's
    dropout (0.1 in hidden states and attention)."""
    settings = dict(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        attention_probs_dropout_prob=0.1,
        hidden_dropout_prob=0.1,
        pad_token_id=0,
    )
    return seqbert.SeqBertConfig(**(settings | overrides))


@pytest.fixture(scope="module")
def snippets(tokenizer, rt_texts) -> dict[str, torch.Tensor]:
    """8 real snippets padded to the longest (about half padding), with segment ids."""
    batch = dict(tokenizer(rt_texts[:8], padding=True, return_tensors="pt"))
    assert 0.2 < (batch["attention_mask"] == 0).float().mean() < 0.8
    return batch


@dataclasses.dataclass
class DryRun:
    """A flow's outcome on the fake GPU: the model, its output, what the path check saw, the host reads served, the
    host syncs, the sdpa calls by kernel and the batch's sequences."""

    model: torch.nn.Module
    output: object
    record: fake_cuda.PathRecord
    reads: list[fake_cuda.HostRead]
    syncs: list[fake_cuda.HostSync]
    sdpa: dict[str, int]
    layout: fake_cuda.SequenceLayout


def _loss(output) -> torch.Tensor:
    return output.loss if getattr(output, "loss", None) is not None else output[0].float().sum()


@contextlib.contextmanager
def layouts_computed():
    """Collects every `UnpaddedBatch.from_mask` result of the code run inside it. Entered for the CPU run and the fake
    one alike, so that both reach the host read through the same frames (`fake_cuda.call_site`)."""
    computed = []
    from_mask = UnpaddedBatch.from_mask

    def collecting(cls, *args, **kwargs):
        batch = from_mask(*args, **kwargs)
        computed.append(batch)
        return batch

    with mock.patch.object(UnpaddedBatch, "from_mask", classmethod(collecting)):
        yield computed


def check_cpu_layouts(computed: list[UnpaddedBatch], layout: fake_cuda.SequenceLayout) -> None:
    """The layouts the CPU run computed (real tensors: `cu_seqlens` has values there, a fake run's has none) against
    the batch's sequences: `cu_seqlens`, T and `max_seqlen` are what the GPU run hands the kernel."""
    for batch in computed:
        cpu = {"cu_seqlens": batch.cu_seqlens.tolist(), "T": batch.num_tokens, "max_seqlen": batch.max_seqlen}
        expected = {"cu_seqlens": layout.cu_seqlens, "T": layout.num_tokens, "max_seqlen": layout.max_seqlen}
        if cpu != expected:
            raise fake_cuda.LayoutMismatch(
                f"the CPU run of the same batch computed {cpu}; the batch ({layout.source}) has {expected}"
            )


def check_syncs(syncs: list[fake_cuda.HostSync], expected: int) -> None:
    if len(syncs) != expected:
        raise fake_cuda.CudaPathFault(
            f"{len(syncs)} host syncs, expected {expected}: " + "; ".join(f"{s.kind} at {s.where}" for s in syncs)
        )


def check_sdpa(calls: dict[str, int], record: fake_cuda.PathRecord, expected: dict[str, int], train: bool) -> None:
    """sdpa ran the kernels of `expected`, as often (forward, and backward in training), and no other."""
    if dict(calls) != expected:
        raise fake_cuda.CudaPathFault(f"sdpa ran {dict(calls)}, expected {expected}")
    for kernel, backward in SDPA_BACKWARD.items():
        count = expected.get(kernel, 0) if train else 0
        if record.ops[backward] != count:
            raise fake_cuda.CudaPathFault(f"{backward} ran {record.ops[backward]} times, expected {count}")


def dry_run(
    model_class,
    config,
    batch: dict,
    dtype: torch.dtype = torch.bfloat16,
    train: bool = True,
    autocast: bool = False,
    prepare=lambda model: None,
    kernels: int | None = LAYERS,
    sdpa: dict[str, int] | None = None,
    host_syncs: int = 1,
    capability: tuple[int, int] = fake_cuda.CAPABILITY,
) -> DryRun:
    """
    One forward (with `train`, and backward) of `model_class(config)` on a fake GPU of compute capability
    `capability`, weights in `dtype`, under bf16 autocast with `autocast`; `prepare(model)` runs on both the CPU model
    (whose host reads are served) and the fake one. Asserts (raising `fake_cuda.CudaPathFault`) the devices of
    outputs and gradients, `kernels` flash calls forward (and backward), the sdpa calls `sdpa` by kernel (none by
    default), and `host_syncs` host syncs; the contract, layout (`fake_cuda.LayoutMismatch`) and CPU-tensor checks
    raise on their own.
    """
    layout = fake_cuda.SequenceLayout.of_batch(batch)
    cpu_model = model_class(config).train(train)
    prepare(cpu_model)
    cpu_batch = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def cpu_step():
        output = cpu_model(**cpu_batch)
        if train:
            _loss(output).backward()

    with layouts_computed() as computed:
        reads = fake_cuda.record_host_reads(cpu_step)
    check_cpu_layouts(computed, layout)
    with fake_cuda.FakeGPU(reads, capability) as gpu, fake_cuda.GpuSdpaChoice() as choice, layouts_computed():
        model = gpu.model(model_class, config, dtype).train(train)
        prepare(model)
        inputs = gpu.tensors(batch)
        with gpu.checked(layout) as record:
            with gpu.autocast() if autocast else contextlib.nullcontext():
                output = model(**inputs)
            if train:
                _loss(output).backward()
        _check_devices(model, output, train)
    check_syncs(gpu.syncs, host_syncs)
    if kernels is not None and record.flash_forward != kernels:
        raise fake_cuda.CudaPathFault(f"the flash kernel ran {record.flash_forward} times forward, expected {kernels}")
    if kernels is not None and train and record.flash_backward != kernels:
        raise fake_cuda.CudaPathFault(
            f"the flash kernel ran {record.flash_backward} times backward, expected {kernels}"
        )
    check_sdpa(choice.calls, record, sdpa or {}, train)
    return DryRun(model, output, record, gpu.reads.served, gpu.syncs, dict(choice.calls), layout)


def _check_devices(model, output, train: bool) -> None:
    tensors = [t for t in torch.utils._pytree.tree_leaves(dict(output)) if isinstance(t, torch.Tensor)]
    off = [tuple(t.shape) for t in tensors if t.device.type != "cuda"]
    if not tensors or off:
        raise fake_cuda.CudaPathFault(f"outputs not on CUDA: {off}")
    if train:
        grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
        if all(g is None for g in grads.values()):
            raise fake_cuda.CudaPathFault("no parameter received a gradient")
        off = [name for name, g in grads.items() if g is not None and g.device.type != "cuda"]
        if off:
            raise fake_cuda.CudaPathFault(f"gradients not on CUDA: {off}")


# ----------------------------------------------------------------------------------------------------------------------
# The harness's own parts
# ----------------------------------------------------------------------------------------------------------------------


def test_the_sequences_of_a_batch_are_computed_from_the_batch_alone():
    """`SequenceLayout.of_batch`, the harness's independent reference for what the kernel is told: padded rows (an
    empty one dropped), packed rows from `position_ids` restarting and from `cu_seq_lens_q`."""
    padded = {
        "input_ids": torch.ones(3, 5, dtype=torch.long),
        "attention_mask": torch.tensor([[1] * 5, [0] * 5, [1] * 3 + [0] * 2]),
    }
    layout = fake_cuda.SequenceLayout.of_batch(padded)
    assert (layout.lengths, layout.num_tokens, layout.num_sequences, layout.max_seqlen) == ((5, 3), 8, 2, 5)
    assert layout.cu_seqlens == [0, 5, 8]
    packed = {"input_ids": torch.ones(1, 7, dtype=torch.long), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1]])}
    assert fake_cuda.SequenceLayout.of_batch(packed).lengths == (3, 2, 2)
    flattened = {"input_ids": torch.ones(1, 7, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 4, 7])}
    assert fake_cuda.SequenceLayout.of_batch(flattened).lengths == (4, 3)


def _copied_and_read(tensor: torch.Tensor) -> list:
    return tensor.cpu().tolist()


def test_a_copy_to_the_host_then_read_is_one_sync():
    """`.cpu()` then `.tolist()`: the copy is the sync (the host waits for the GPU there); the read of the CPU copy is
    served from the CPU run of the same code, matched by its call site, and syncs nothing more."""
    values = torch.arange(3)
    reads = fake_cuda.record_host_reads(lambda: _copied_and_read(values))
    with fake_cuda.FakeGPU(reads) as gpu:
        tensor = gpu.tensor(values)
        with gpu.checked():
            assert _copied_and_read(tensor) == [0, 1, 2]
    assert [(sync.kind, sync.shape) for sync in gpu.syncs] == [("device-to-host copy", (3,))]
    assert len(gpu.reads.served) == 1


def test_the_sdpa_choice_follows_the_device_the_dtype_and_the_head_size():
    """`fake_cuda.sdpa_kernel`, after torch's `sdp_utils.cpp`: flash needs half precision, no mask, sm80 or newer and
    a head size up to 256 (sdpa pads it to a multiple of 8); the memory-efficient kernel a head size aligned for the
    device's matrix products (8 in half precision, 4 in fp32 from sm80); else the math path."""

    def kernel(capability, dtype, head_size, mask=None):
        query = torch.empty(2, 4, 8, head_size, dtype=dtype)
        with mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: capability):
            return fake_cuda.sdpa_kernel(query, query, query, mask, is_causal=False)

    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    assert kernel((9, 0), torch.bfloat16, 64) == "flash"
    assert kernel((9, 0), torch.bfloat16, 64, mask) == "efficient"
    assert kernel((9, 0), torch.bfloat16, 264) == "efficient"
    assert kernel((9, 0), torch.bfloat16, 12) == "flash"  # sdpa pads the head size to a multiple of 8 for flash
    assert kernel((9, 0), torch.bfloat16, 12, mask) == "math"
    assert kernel((9, 0), torch.float32, 12) == "efficient"
    assert kernel((7, 5), torch.float16, 64) == "efficient"
    assert kernel((7, 5), torch.float32, 12) == "efficient"


# ----------------------------------------------------------------------------------------------------------------------
# Flows
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_inference_forward(snippets, norm_placement, dtype):
    run = dry_run(seqbert.SeqBertModel, tiny_config(norm_placement=norm_placement), snippets, dtype, train=False)
    hidden = run.output.last_hidden_state
    assert hidden.shape == (*snippets["input_ids"].shape, 64) and hidden.dtype == dtype
    assert run.output.pooler_output.shape == (8, 64)
    lengths = snippets["attention_mask"].sum(1)
    assert run.layout.max_seqlen == lengths.max() and run.layout.num_tokens == lengths.sum()


def _labels(name: str, batch: dict) -> dict:
    generator = torch.Generator().manual_seed(0)
    mask = batch["attention_mask"].bool()
    if name == "sequence":
        return {"labels": torch.randint(0, 2, mask.shape[:1], generator=generator)}
    if name == "token":
        return {"labels": torch.randint(0, 3, mask.shape, generator=generator).masked_fill(~mask, -100)}
    if name == "qa":
        lengths = mask.sum(1)
        start = (torch.rand(len(lengths), generator=generator) * lengths).long()
        return {"start_positions": start, "end_positions": torch.minimum(start + 2, lengths - 1)}
    chosen = (torch.rand(mask.shape, generator=generator) < 0.15) & mask
    chosen[:, 1] = True  # every row has a masked token
    return {"labels": batch["input_ids"].masked_fill(~chosen, -100)}


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize(
    "head",
    [
        ("sequence", seqbert.SeqBertForSequenceClassification),
        ("token", seqbert.SeqBertForTokenClassification),
        ("qa", seqbert.SeqBertForQuestionAnswering),
        ("sparse masked LM", seqbert.SeqBertForMaskedLM),
    ],
    ids=lambda head: head[0],
)
def test_training_step_of_each_encoder_head(snippets, head, norm_placement):
    name, model_class = head
    config = tiny_config(norm_placement=norm_placement, num_labels=2 if name == "qa" else 3, sparse_prediction=True)
    run = dry_run(model_class, config, {**snippets, **_labels(name, snippets)})
    assert run.output.loss.shape == () and run.output.loss.device.type == "cuda"


def test_training_step_of_multiple_choice(snippets):
    """Two choices per question: the (B, 2, L) inputs flatten to 2B sequences for the encoder."""
    choices = {k: v.view(4, 2, -1) for k, v in snippets.items()}
    run = dry_run(seqbert.SeqBertForMultipleChoice, tiny_config(), {**choices, "labels": torch.tensor([0, 1, 1, 0])})
    assert run.output.logits.shape == (4, 2)
    assert run.layout.num_sequences == 8


def test_training_step_of_the_causal_lm(snippets):
    """Decoder-only (BERT's `BertLMHeadModel`): causal self-attention on the padded batch, with a mask, through sdpa's
    memory-efficient kernel (what sdpa picks on an H100 where a mask is given), not the variable-length one."""
    labels = snippets["input_ids"].masked_fill(snippets["attention_mask"] == 0, -100)
    batch = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"], "labels": labels}
    run = dry_run(seqbert.SeqBertForCausalLM, tiny_config(), batch, kernels=0, sdpa={"efficient": LAYERS})
    assert run.output.logits.shape == (*labels.shape, 30522)


def _seq2seq_config(**overrides):
    return tiny_config(is_encoder_decoder=True, num_decoder_layers=LAYERS, decoder_start_token_id=101, **overrides)


def test_training_step_of_the_seq2seq_model(snippets):
    """Encoder on the variable-length kernel, decoder (causal self-attention, cross-attention, each with a mask) on
    sdpa's memory-efficient kernel: twice a decoder layer."""
    labels = snippets["input_ids"][:, :12].masked_fill(snippets["attention_mask"][:, :12] == 0, -100)
    batch = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"], "labels": labels}
    run = dry_run(seqbert.SeqBertForConditionalGeneration, _seq2seq_config(), batch, sdpa={"efficient": 2 * LAYERS})
    assert run.output.logits.shape == (8, 12, 30522)


def test_the_seq2seq_decoders_cached_step(snippets):
    """A generation step after the first: the decoder reads its self-attention cache and the cross-attention keys
    and values computed on the first step; no encoder run, no variable-length kernel, exactly one host sync (the
    decoder's checks). On each step, a decoder layer's self-attention (no mask: the decoder's tokens are all real)
    runs sdpa's flash kernel, its cross-attention (the source's mask) the memory-efficient one."""
    config = _seq2seq_config()
    source = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"]}
    start = torch.full((8, 1), 101)
    layout = fake_cuda.SequenceLayout.of_batch(source)

    def first_step(model, source, start):
        encoder_outputs = model.get_encoder()(**source)
        first = model(**source, encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
        return encoder_outputs, first

    def next_step(model, source, encoder_outputs, first):
        return model(
            attention_mask=source["attention_mask"],
            encoder_outputs=encoder_outputs,
            decoder_input_ids=first.logits[:, -1:].argmax(-1),
            **{CACHE_NAME: getattr(first, CACHE_NAME)},
            use_cache=True,
        )

    # The reads of both steps (encoder, decoder) come from the CPU run of the same two steps.
    cpu_model = seqbert.SeqBertForConditionalGeneration(config).eval()
    reads = fake_cuda.record_host_reads(lambda: next_step(cpu_model, source, *first_step(cpu_model, source, start)))
    with fake_cuda.FakeGPU(reads) as gpu, fake_cuda.GpuSdpaChoice() as choice:
        model = gpu.model(seqbert.SeqBertForConditionalGeneration, config, torch.bfloat16).eval()
        source = gpu.tensors(source)
        with torch.no_grad(), gpu.checked(layout) as record:
            encoder_outputs, first = first_step(model, source, gpu.tensor(start))
            before = (len(gpu.syncs), record.flash_forward, dict(choice.calls))
            step = next_step(model, source, encoder_outputs, first)
        assert step.logits.shape == (8, 1, 30522) and step.logits.device.type == "cuda"
        assert getattr(step, CACHE_NAME).get_seq_length() == 2
        assert record.flash_forward == before[1] == LAYERS  # the encoder only
        check_syncs(gpu.syncs[before[0] :], 1)
        assert before[2] == {"flash": LAYERS, "efficient": LAYERS}
        assert choice.calls == {"flash": 2 * LAYERS, "efficient": 2 * LAYERS}


@pytest.mark.parametrize("cu_seq_lens", [False, True], ids=["position_ids", "cu_seq_lens_q"])
def test_packed_rows_from_the_flattening_collator(tokenizer, rt_texts, cu_seq_lens):
    """One row of 8 snippets with restarting `position_ids` (and `cu_seq_lens_q` / `max_length_q` when the collator
    is asked for them), token-classification labels: each sequence attends to itself only, through the kernel, which
    is told the 8 snippets' lengths."""
    features = [
        {"input_ids": ids, "labels": [i % 3] * len(ids)} for i, ids in enumerate(tokenizer(rt_texts[:8])["input_ids"])
    ]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=cu_seq_lens)(features)
    batch = {k: v for k, v in batch.items() if k not in ("cu_seq_lens_k", "max_length_k")}
    if cu_seq_lens:
        assert batch["cu_seq_lens_q"].numel() == 9
    run = dry_run(seqbert.SeqBertForTokenClassification, tiny_config(num_labels=3), batch)
    assert run.output.logits.shape == (*batch["input_ids"].shape, 3)
    assert run.layout.lengths == tuple(len(feature["input_ids"]) for feature in features)


def test_gradient_checkpointing(snippets):
    """Each layer's forward runs again in backward: the kernel twice a layer forward, once backward, still one
    host sync."""
    batch = {**snippets, **_labels("sequence", snippets)}
    model_class, config = seqbert.SeqBertForSequenceClassification, tiny_config()

    def checkpointing(model):
        model.activation_checkpointing_enable()

    with pytest.raises(fake_cuda.CudaPathFault, match="ran 4 times forward, expected 2"):
        dry_run(model_class, config, batch, prepare=checkpointing)
    record = dry_run(model_class, config, batch, prepare=checkpointing, kernels=None).record
    assert record.flash_forward == 2 * LAYERS and record.flash_backward == LAYERS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_weights(snippets, dtype):
    run = dry_run(
        seqbert.SeqBertForSequenceClassification, tiny_config(), {**snippets, **_labels("sequence", snippets)}, dtype
    )
    assert run.output.logits.dtype == dtype
    assert run.model.classifier.weight.grad.dtype == dtype


def test_fp32_weights_under_bf16_autocast(snippets):
    """What `Trainer(bf16=True)` runs: fp32 weights, the forward under `torch.autocast("cuda", torch.bfloat16)`
    (kept on by the fake device's `torch.cuda.is_available()`): the kernel takes bf16 queries, gradients come back
    fp32."""
    batch = {**snippets, **_labels("sequence", snippets)}
    run = dry_run(seqbert.SeqBertForSequenceClassification, tiny_config(), batch, torch.float32, autocast=True)
    assert run.output.logits.dtype == torch.bfloat16
    assert all(p.grad.dtype == torch.float32 for p in run.model.parameters() if p.grad is not None)


def _float_values(model):
    """Every value projection returns fp32 (as a quantized or adapter linear may): attention falls back to the
    per-sequence layout."""
    encoder = getattr(model, "seqbert", model)
    for layer in encoder.encoder.layers:
        layer.attention.value.register_forward_hook(lambda module, args, output: output.float())


def test_the_fallback_runs_no_kernel_and_no_extra_host_read(snippets):
    batch = {**snippets, **_labels("sequence", snippets)}
    dry_run(
        seqbert.SeqBertForSequenceClassification,
        tiny_config(),
        batch,
        prepare=_float_values,
        kernels=0,
        sdpa={"efficient": LAYERS},
    )


@pytest.mark.parametrize(
    ("overrides", "dtype", "capability", "kernel"),
    [
        (dict(hidden_size=48, intermediate_size=96), torch.bfloat16, (9, 0), "math"),
        (dict(hidden_size=264, num_attention_heads=1), torch.bfloat16, (9, 0), "efficient"),
        ({}, torch.float16, (7, 5), "efficient"),
        ({}, torch.float32, (9, 0), "efficient"),
    ],
    ids=["head size 12", "head size 264", "compute capability 7.5", "fp32 without autocast"],
)
def test_outside_the_kernels_entry_conditions_attention_runs_sdpa(snippets, overrides, dtype, capability, kernel):
    """The variable-length kernel takes head sizes that are a multiple of 8 up to 256, on sm80 or newer, in fp16 /
    bf16. Past each of these, a training step lays the batch out per sequence for sdpa instead: the kernel runs 0
    times, sdpa runs the kernel it picks there once a layer (the math path for head size 12 in bf16, which the
    memory-efficient kernel cannot align), and the host is still synced once."""
    batch = {**snippets, **_labels("sequence", snippets)}
    config = tiny_config(**overrides)
    run = dry_run(
        seqbert.SeqBertForSequenceClassification,
        config,
        batch,
        dtype,
        kernels=0,
        sdpa={kernel: LAYERS},
        capability=capability,
    )
    assert run.output.logits.dtype == dtype and run.model.classifier.weight.grad.dtype == dtype


# ----------------------------------------------------------------------------------------------------------------------
# Static batches (`StaticShapeCollator`): no host read at all, what a CUDA graph captures
# ----------------------------------------------------------------------------------------------------------------------


def _static_examples(tokenizer, rt_texts, name: str) -> list[dict]:
    """8 real snippets, unpadded, with the labels of head `name` (a question of two choices for multiple choice)."""
    encoded = [dict(tokenizer(text)) for text in rt_texts[:8]]
    generator = torch.Generator().manual_seed(0)
    if name == "sequence":
        return [{**e, "label": i % 2} for i, e in enumerate(encoded)]
    if name == "token":
        return [
            {**e, "labels": torch.randint(0, 3, (len(e["input_ids"]),), generator=generator).tolist()} for e in encoded
        ]
    if name == "qa":
        return [{**e, "start_positions": 1, "end_positions": len(e["input_ids"]) - 2} for e in encoded]
    if name == "choice":
        return [
            {
                "input_ids": [a["input_ids"], b["input_ids"]],
                "token_type_ids": [a["token_type_ids"], b["token_type_ids"]],
                "label": 1,
            }
            for a, b in zip(encoded[::2], encoded[1::2], strict=True)
        ]
    return encoded  # masked LM: the collator masks


STATIC_HEADS = {
    "sequence": seqbert.SeqBertForSequenceClassification,
    "token": seqbert.SeqBertForTokenClassification,
    "qa": seqbert.SeqBertForQuestionAnswering,
    "choice": seqbert.SeqBertForMultipleChoice,
    "sparse masked LM": seqbert.SeqBertForMaskedLM,
}


def _static_batch(tokenizer, rt_texts, name: str, config, validate: bool = False) -> dict:
    """The collator's batch, as the compiled step under CUDA graphs runs it: the layout's eager validation off (under
    `torch.compile` nothing is read; `validate_static_layout=False` is the same eagerly)."""
    torch.manual_seed(0)  # masked LM's masking
    collator = StaticShapeCollator(tokenizer, STATIC_HEADS[name](config), max_length=64)
    batch = collator(_static_examples(tokenizer, rt_texts, name))
    return batch if validate else {**batch, "validate_static_layout": False}


@pytest.mark.parametrize("name", list(STATIC_HEADS))
def test_a_static_training_step_reads_nothing(tokenizer, rt_texts, name):
    """Every encoder head's training step on the collator's batch: no host sync, the kernel told the static layout
    (T the bucket's tokens, S its slots, `max_seqlen` the bound the batch states), forward and backward."""
    config = tiny_config(num_labels=2 if name == "qa" else 3, sparse_prediction=True)
    batch = _static_batch(tokenizer, rt_texts, name, config)
    run = dry_run(STATIC_HEADS[name], config, batch, host_syncs=0)
    assert run.output.loss.shape == () and run.output.loss.device.type == "cuda"
    assert run.layout.num_tokens == batch["indices"].numel() and run.layout.max_seqlen == 64
    rows = batch["attention_mask"].reshape(-1, 64).shape[0]  # every example's (every choice's) sequence, then filler
    assert run.layout.num_sequences == batch["cu_seqlens"].numel() - 1 > rows


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16 weights", "fp32 weights under bf16 autocast"])
def test_static_inference_and_autocast_read_nothing(tokenizer, rt_texts, autocast):
    """The encoder's inference forward (bf16), and a classifier's training step as `Trainer(bf16=True)` runs it."""
    config = tiny_config(num_labels=3)
    batch = _static_batch(tokenizer, rt_texts, "sequence", config)
    if autocast:
        run = dry_run(STATIC_HEADS["sequence"], config, batch, torch.float32, autocast=True, host_syncs=0)
        assert run.output.logits.shape == (8, 3)  # one row per example
    else:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        run = dry_run(seqbert.SeqBertModel, config, inputs, train=False, host_syncs=0)
        assert run.output.last_hidden_state.shape == (*batch["input_ids"].shape, 64)
        assert run.output.pooler_output.shape == (8, 64)


@pytest.fixture
def static_step(tokenizer, rt_texts):
    config = tiny_config(num_labels=3)
    batch = _static_batch(tokenizer, rt_texts, "sequence", config)
    return batch, lambda batch: dry_run(STATIC_HEADS["sequence"], config, batch, host_syncs=0)


def test_a_static_batch_whose_bound_is_below_a_sequence_fails(static_step):
    """Planted: `max_seqlen` one below the longest snippet (a collator that fixed the bound wrongly): the kernel
    would compute part of that sequence only, without an error."""
    batch, step = static_step
    offsets = batch["cu_seqlens"].tolist()
    longest = max(end - start for start, end in zip(offsets, offsets[1:], strict=False))
    wrong = {**batch, "max_seqlen": longest - 1}
    with pytest.raises(fake_cuda.LayoutMismatch, match=f"the batch holds a sequence of {longest} tokens"):
        step(wrong)


def test_an_eager_static_step_reads_the_host_once_to_validate_its_layout(tokenizer, rt_texts):
    """Eagerly, with its validation on (the default), a static step reads the host once: the layout checked against
    the attention mask with the input checks; a wrong `max_seqlen` then stops there, named, before any kernel."""
    config = tiny_config(num_labels=3)
    batch = _static_batch(tokenizer, rt_texts, "sequence", config, validate=True)
    dry_run(STATIC_HEADS["sequence"], config, batch, host_syncs=1)
    with pytest.raises(ValueError, match=r"max_seqlen \(8\) is below the layout's longest sequence"):
        dry_run(STATIC_HEADS["sequence"], config, {**batch, "max_seqlen": 8}, host_syncs=1)


def test_a_host_read_in_a_static_step_fails(static_step, monkeypatch):
    """Planted: an `.item()` in the step (the token count read back, as a check might)."""
    batch, step = static_step
    encode = seqbert.SeqBertModel._encode_unpadded

    def planted(self, unpadded, *args, **kwargs):
        assert unpadded.num_tokens == int(unpadded.cu_seqlens[-1].item())
        return encode(self, unpadded, *args, **kwargs)

    monkeypatch.setattr(seqbert.SeqBertModel, "_encode_unpadded", planted)
    with pytest.raises(
        fake_cuda.CudaPathFault, match=r"1 host syncs, expected 0: item at test_cuda_dry_run.py:\d+ planted"
    ):
        step(batch)


# ----------------------------------------------------------------------------------------------------------------------
# Trainer's own loop around the step: what it reads on the host, with its defaults and with the route's settings
# ----------------------------------------------------------------------------------------------------------------------


class StagedBatches:
    """The training batches of a `DryRunTrainer`, collated on the CPU beforehand, handed to `Trainer`'s loop as
    accelerate's `DataLoaderShard` hands them over: moved to the device by accelerate's own `send_to_device`, blocking
    or not as `Trainer`'s `accelerator_config` says (`non_blocking`)."""

    def __init__(self, trainer: "DryRunTrainer"):
        self.trainer = trainer

    def __len__(self) -> int:
        return len(self.trainer.batches)

    def __iter__(self):
        non_blocking = self.trainer.accelerator.dataloader_config.non_blocking
        for batch in self.trainer.batches:
            yield send_to_device(self.trainer.stage(batch), self.trainer.args.device, non_blocking=non_blocking)


class DryRunTrainer(Trainer):
    """transformers' `Trainer`, unchanged but for its training data loader (`StagedBatches`: a data loader's worker
    processes and pinned memory are the host's own business, and run on real CPU tensors outside the fake GPU)."""

    batches: list[dict] = []
    stage = staticmethod(lambda batch: batch)

    def get_train_dataloader(self):
        return StagedBatches(self)


@contextlib.contextmanager
def fresh_accelerate_state():
    """accelerate's process-wide state, made anew for a `Trainer` on another device, and again after it."""
    PartialState._reset_state()
    AcceleratorState._reset_state(True)
    try:
        yield
    finally:
        PartialState._reset_state()
        AcceleratorState._reset_state(True)


def trainer_syncs(model_class, config, batches: list[dict], **arguments) -> list[fake_cuda.HostSync]:
    """The host syncs of `Trainer.train()` over `batches` (one optimizer step each, bf16, fused AdamW as `Trainer`
    takes it on a GPU, gradient clipping, a learning-rate schedule), on the fake GPU: a CPU run of the same loop first
    records the reads (`record_host_reads`), then the fake run is served them and counts every sync."""

    def training_arguments(**device) -> TrainingArguments:
        settings = dict(per_device_train_batch_size=8, max_steps=len(batches), bf16=True, optim="adamw_torch_fused")
        settings |= dict(report_to="none", logging_steps=len(batches) + 1, save_strategy="no", disable_tqdm=True)
        return TrainingArguments("unused", **(settings | arguments | device))

    def cpu_run():
        torch.manual_seed(0)
        trainer = DryRunTrainer(model=model_class(config), args=training_arguments(use_cpu=True))
        trainer.batches = batches
        trainer.train()

    with fresh_accelerate_state():
        reads = fake_cuda.record_host_reads(cpu_run)
    with (
        fresh_accelerate_state(),
        fake_cuda.FakeGPU(reads) as gpu,
        mock.patch.object(torch.cuda, "set_device", lambda device: None),  # a CPU build has no device to set
        mock.patch.object(TrainingArguments, "place_model_on_device", False),  # it is there already
    ):
        model = gpu.model(model_class, config)
        model.to = lambda *args, **kwargs: model  # accelerate moves it to "cuda:0", where it is (a fake tensor moves)
        trainer = DryRunTrainer(model=model, args=training_arguments())
        trainer.batches = batches
        trainer.stage = lambda batch: {
            k: gpu.mode.from_tensor(v) if torch.is_tensor(v) else v for k, v in batch.items()
        }
        with gpu.checked():
            trainer.train()
    return gpu.syncs


@pytest.fixture(scope="module")
def trainer_batches(tokenizer, rt_texts) -> dict[str, tuple]:
    """Two static batches of 8 real snippets, for a sequence and a token classifier (whose loss takes Trainer's
    `num_items_in_batch`, counted on the device)."""
    config = tiny_config(num_labels=2, problem_type="single_label_classification")
    runs = {}
    for name, model_class in (
        ("sequence", seqbert.SeqBertForSequenceClassification),
        ("token", seqbert.SeqBertForTokenClassification),
    ):
        collator = StaticShapeCollator(tokenizer, model_class(config), max_length=64, batch_size=8)
        examples = _static_examples(tokenizer, rt_texts, name)
        generator = torch.Generator().manual_seed(0)
        examples = [
            {**e, "label": i % 2}
            if name == "sequence"
            else {**e, "labels": torch.randint(0, 2, (len(e["input_ids"]),), generator=generator).tolist()}
            for i, e in enumerate(examples)
        ]
        batch = {**collator(examples), "validate_static_layout": False}  # as compiled: nothing read (see above)
        runs[name] = (model_class, config, [batch] * 2)
    return runs


@pytest.mark.parametrize("name", ["sequence", "token"])
def test_trainers_defaults_read_the_host_every_step_and_the_routes_settings_never(trainer_batches, name):
    """`Trainer.train()` over 2 static batches. With its defaults, every step: a blocking host-to-device copy of each
    input tensor (each waits for the GPU to finish what it was given) and 2 reads of the loss
    (`logging_nan_inf_filter`: `torch.isnan(loss) or torch.isinf(loss)`). With the route's settings
    (`seqbert.static_shapes.training_arguments()`: no filter, non-blocking copies; the compile flags need a GPU): none
    in any step, and the loop's own two, once per run (its on-device loss total created, then read at the end). The
    token classifier's `num_items_in_batch` is counted on the device."""
    model_class, config, batches = trainer_batches[name]
    per_step = len([value for value in batches[0].values() if torch.is_tensor(value)]) + 2
    defaults = trainer_syncs(model_class, config, batches)
    route = {k: v for k, v in training_arguments().items() if not k.startswith("torch_compile")}
    settings = trainer_syncs(model_class, config, batches, **route)
    once = [("host-to-device copy", "_inner_training_loop"), ("item", "_finalize_training")]
    assert [(sync.kind, sync.where.split()[-1]) for sync in settings] == once, settings
    assert len(defaults) == 2 * per_step + 2, defaults
    filter_reads = [sync for sync in defaults if sync.kind == "__bool__" and sync.where.endswith("_run_epoch")]
    copies = [sync for sync in defaults if sync.kind == "host-to-device copy" and "send_to_device" in sync.where]
    assert len(filter_reads) == 2 * 2 and len(copies) == 2 * (per_step - 2)


# ----------------------------------------------------------------------------------------------------------------------
# Planted faults: each must make the dry run fail
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def training_step(snippets):
    batch = {**snippets, **_labels("sequence", snippets)}
    return lambda: dry_run(seqbert.SeqBertForSequenceClassification, tiny_config(), batch)


@pytest.fixture
def inference_step(snippets):
    """A forward without labels: enough for a planted fault in the forward, at half the cost of a training step."""
    return lambda: dry_run(seqbert.SeqBertModel, tiny_config(), snippets, train=False)


def test_the_unplanted_steps_pass(training_step, inference_step):
    assert training_step().record.flash_forward == LAYERS
    assert inference_step().record.flash_forward == LAYERS


def test_a_cpu_tensor_inside_the_path_fails(training_step, monkeypatch):
    """Position ids made with `torch.arange(L)`, without `device=`."""
    forward = seqbert.modeling_seqbert.SeqBertEmbeddings.forward

    def planted(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, unpadded=None):
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        position_ids = torch.arange(length).unsqueeze(0) if position_ids is None else position_ids
        return forward(self, input_ids, token_type_ids, position_ids, inputs_embeds, unpadded)

    monkeypatch.setattr(seqbert.modeling_seqbert.SeqBertEmbeddings, "forward", planted)
    with pytest.raises(fake_cuda.CudaPathFault, match=r"a tensor created on the CPU inside the CUDA path: aten.arange"):
        training_step()


def test_int64_cu_seqlens_fail(training_step, monkeypatch):
    from_mask = UnpaddedBatch.from_mask.__func__

    def planted(cls, *args, **kwargs):
        batch = from_mask(cls, *args, **kwargs)
        return dataclasses.replace(batch, cu_seqlens=batch.cu_seqlens.long())

    monkeypatch.setattr(UnpaddedBatch, "from_mask", classmethod(planted))
    with pytest.raises(fake_cuda.FlashContractViolation, match="cu_seqlens_q must have dtype int32, got torch.int64"):
        training_step()


def _plant_in_the_kernels_call(monkeypatch, change):
    """`varlen_attention_forward` as the modeling file calls it, its queries, keys and values changed by `change`
    after `varlen_attention_fits` has let them through."""
    forward = attention_backends.varlen_attention_forward

    def planted(query, key, value, unpadded, dropout=0.0, scaling=None):
        return forward(*change(query, key, value), unpadded, dropout, scaling)

    monkeypatch.setattr(seqbert.modeling_seqbert, "varlen_attention_forward", planted)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda q, k, v: (q, k.half(), v), r"query and key must have the same dtype \(torch.bfloat16, torch.float16\)"),
        (lambda q, k, v: (q.float(), k.float(), v.float()), "FlashAttention only supports fp16 and bf16, got torch.float32"),
        (
            lambda q, k, v: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
            r"query must have a contiguous last dimension \(stride \(64, 1, 4\)\)",
        ),
    ],
    ids=["key of another dtype", "fp32 queries", "query with a strided last dimension"],
)  # fmt: skip
def test_arguments_the_kernel_rejects_fail(inference_step, monkeypatch, change, message):
    """Arguments `mha_varlen_fwd` refuses on a GPU (a dtype other than fp16 / bf16 or the query's; a last dimension
    that is not contiguous), which torch's meta kernel lets through."""
    _plant_in_the_kernels_call(monkeypatch, change)
    with pytest.raises(fake_cuda.FlashContractViolation, match=message):
        inference_step()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda batch: dataclasses.replace(batch, max_seqlen=batch.max_seqlen - 1),
            r"the flash kernel \(forward\) was given max_seqlen_q = (\d+); the batch \(attention_mask\) has (?!\1)\d+",
        ),
        (
            lambda batch: dataclasses.replace(batch, cu_seqlens=batch.cu_seqlens[:-1]),
            r"was given S \(cu_seqlens_q.numel\(\) - 1\) = 7; the batch \(attention_mask\) has 8",
        ),
    ],
    ids=["max_seqlen one too small", "a sequence missing from cu_seqlens"],
)
def test_a_layout_the_kernel_trusts_but_is_wrong_fails(inference_step, monkeypatch, change, message):
    """The kernel reads neither T nor `max_seqlen` from `cu_seqlens`: told one sequence too few, or a longest
    sequence one token short, it runs, and computes wrong results. Planted where the layout is computed, on the GPU
    only (the CPU run of the same batch, whose layout is checked as well, stays right)."""
    from_mask = UnpaddedBatch.from_mask.__func__

    def planted(cls, *args, **kwargs):
        batch = from_mask(cls, *args, **kwargs)
        return change(batch) if batch.cu_seqlens.device.type == "cuda" else batch

    monkeypatch.setattr(UnpaddedBatch, "from_mask", classmethod(planted))
    with pytest.raises(fake_cuda.LayoutMismatch, match=message):
        inference_step()


def test_a_second_host_read_fails(training_step, monkeypatch):
    """The number of real tokens read again (a 0-dim `.item()`) after the layout's read, as a check might."""
    encode = seqbert.SeqBertModel._encode_unpadded

    def planted(self, unpadded, *args, **kwargs):
        assert unpadded.indices.shape[0] == int(unpadded.cu_seqlens[-1].item())
        return encode(self, unpadded, *args, **kwargs)

    monkeypatch.setattr(seqbert.SeqBertModel, "_encode_unpadded", planted)
    with pytest.raises(
        fake_cuda.CudaPathFault,
        match=r"2 host syncs, expected 1: tolist at .*; item at test_cuda_dry_run.py:\d+ planted",
    ):
        training_step()


def test_a_host_read_only_the_cuda_branch_makes_fails(training_step, monkeypatch):
    """The longest sequence read again before each kernel call: a read the CPU run (another branch) never makes."""
    forward = attention_backends.varlen_attention_forward

    def planted(query, key, value, unpadded, dropout=0.0, scaling=None):
        assert unpadded.cu_seqlens.diff().max().item() == unpadded.max_seqlen
        return forward(query, key, value, unpadded, dropout, scaling)

    monkeypatch.setattr(seqbert.modeling_seqbert, "varlen_attention_forward", planted)
    with pytest.raises(fake_cuda.UnexpectedHostRead, match=r"host read #2 \(item of a cuda:0 tensor .* planted"):
        training_step()


def test_the_same_read_from_another_call_site_fails(inference_step, monkeypatch):
    """On CUDA the layout is read through another function than on the CPU: the same method of a tensor of the same
    shape, so a replay matched by method and shape alone would serve it the CPU's value; matched by call site, it
    fails, naming both."""
    from_mask = UnpaddedBatch.from_mask.__func__

    def cuda_branch(cls, *args, **kwargs):
        return from_mask(cls, *args, **kwargs)

    def planted(cls, attention_mask, *args, **kwargs):
        if attention_mask is not None and attention_mask.device.type == "cuda":
            return cuda_branch(cls, attention_mask, *args, **kwargs)
        return from_mask(cls, attention_mask, *args, **kwargs)

    monkeypatch.setattr(UnpaddedBatch, "from_mask", classmethod(planted))
    with pytest.raises(
        fake_cuda.UnexpectedHostRead,
        match=r"host read #1 is tolist of a cuda:0 tensor of shape \(\d+,\) at .*cuda_branch > .*read_on_host; the "
        r"CPU run of the same batch read tolist of shape \(\d+,\) at .*planted > attention_backends.py:\d+ from_mask",
    ):
        inference_step()


def _copy_of_the_token_count(unpadded):
    """The number of real tokens copied to the host as a 0-dim tensor and kept (for a log, say); nothing reads it."""
    return unpadded.cu_seqlens[-1].cpu()


def _position_ids_from_host_data(unpadded):
    """Position ids built on the host and handed to the GPU: `torch.tensor(..., device="cuda")`."""
    return torch.tensor(list(range(unpadded.input_shape[1])), device=unpadded.cu_seqlens.device)


def _synchronize(unpadded):
    """An explicit `torch.cuda.synchronize()` (on CUDA only: the CPU run has no CUDA to synchronize)."""
    if unpadded.cu_seqlens.device.type == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize(
    ("sync", "kind"),
    [
        (_copy_of_the_token_count, "device-to-host copy"),
        (_position_ids_from_host_data, "host-to-device copy"),
        (_synchronize, r"torch\.cuda\.synchronize"),
    ],
    ids=["0-dim cpu()", "torch.tensor(device=cuda)", "torch.cuda.synchronize"],
)
def test_a_host_sync_that_reads_no_value_fails(inference_step, monkeypatch, sync, kind):
    """Host syncs other than a read of a value: a copy to the host (even of a 0-dim tensor, even unread: the host waits
    for the GPU to reach it), a blocking copy to the device (torch synchronizes the stream after it), an explicit
    synchronize. None reads a value, so the CPU run records none; each is counted as a second sync."""
    encode = seqbert.SeqBertModel._encode_unpadded

    def planted(self, unpadded, *args, **kwargs):
        sync(unpadded)
        return encode(self, unpadded, *args, **kwargs)

    monkeypatch.setattr(seqbert.SeqBertModel, "_encode_unpadded", planted)
    with pytest.raises(
        fake_cuda.CudaPathFault, match=rf"2 host syncs, expected 1: tolist at .*; {kind} at test_cuda_dry_run.py:\d+ _"
    ):
        inference_step()


def test_training_sent_to_the_fallback_fails(training_step, monkeypatch):
    """The variable-length path refused where attention dropout is drawn, as before the kernel took dropout."""
    applies = attention_backends.varlen_attention_applies
    monkeypatch.setattr(
        attention_backends,
        "varlen_attention_applies",
        lambda device, dtype, head_dim, dropout: dropout == 0.0 and applies(device, dtype, head_dim, dropout),
    )
    with pytest.raises(fake_cuda.CudaPathFault, match="the flash kernel ran 0 times forward, expected 2"):
        training_step()


# ----------------------------------------------------------------------------------------------------------------------
# GPU memory and FLOPs from the same dry run (scripts/benchmarks/estimate_gpu_memory.py)
# ----------------------------------------------------------------------------------------------------------------------


def test_memory_and_flops_of_a_training_step_against_bert(tmp_path):
    """One bert-base-width layer, 16 and 32 real snippets: what the tracker sees is what the parameters and AdamW
    hold (4 and 8 bytes a parameter, in 512-byte blocks), and the FLOPs follow the real tokens: seqbert's per step are
    BERT's times the share of real tokens, within the attention's and the heads' part. (The full-size figures:
    docs/benchmarks.md, "GPU memory and FLOPs".)"""
    import estimate_gpu_memory

    result = estimate_gpu_memory.main(
        ["--shapes", "base", "--workloads", "snippets", "--batch_sizes", "16", "32", "--num_hidden_layers", "1",
         "--no_search_batches", "--json_file", str(tmp_path / "estimate.json")]
    )  # fmt: skip
    assert (tmp_path / "estimate.json").exists() and result["largest_batches"] == []
    config = estimate_gpu_memory.configs("base", 1)["bert"]
    with torch.device("meta"):
        sizes = [p.numel() for p in BertForSequenceClassification(config).parameters()]
    blocks = sum(-(-4 * n // 512) * 512 for n in sizes)  # fp32, in the caching allocator's 512-byte blocks
    for row in result["rows"]:
        for name in ("seqbert", "bert"):
            at_peak = row[name]["at_peak_gib"]
            assert at_peak["parameters"] * 2**30 == blocks, (name, at_peak)
            assert at_peak["optimizer states"] * 2**30 >= 2 * blocks  # exp_avg and exp_avg_sq (and the step counts)
        real = 1 - row["padding"]
        assert abs(row["flops_ratio"] - real) < 0.05, (row["flops_ratio"], real)
        # At these sizes the peak is the end of backward, weights, AdamW and the dense word-embedding gradient, the same
        # for both; seqbert holds its few-KB token indices there too.
        assert row["peak_ratio"] <= 1.0001, row["peak_ratio"]


# The temporaries the attention backward kernels allocate inside the op (torch's CUDA sources; the arithmetic by
# hand): flash's dq_accum, (T + 128 S) x N x round32(D) x 4, and softmax_d, N x (T + 128 S) x 4; the memory-efficient
# kernel's dQ blocks, B x N x ceil(L / 64) x ceil(D / 64) x (16 + 64 x 64 x 4) (128 x 128 tiles above D = 64), and
# delta, B x N x L x 4; first, the copies of grad_out (flash: and out) that are not contiguous in the kernel's layout.
COPY = 32 * 47 * 12 * 64 * 2  # one (32, 47, 12, 64) bf16 tensor
WORKSPACES = [
    # varlen flash, bert-base heads: T = 300 real tokens in S = 7 sequences: 1,196 rows
    ("_flash_attention_backward", dict(query=(300, 12, 64), cu_seqlens=8), [1196 * 12 * 64 * 4, 12 * 1196 * 4]),
    # head size 72 is padded to 96 in dq_accum
    ("_flash_attention_backward", dict(query=(300, 4, 72), cu_seqlens=3), [556 * 4 * 96 * 4, 4 * 556 * 4]),
    # sdpa's dense flash (no mask), query (B, N, L, D): L = 47 is rounded up to 128 rows a sequence; its forward
    # returns out contiguous as (B, N, L, D), so the kernel copies out and grad_out into (B, L, N, D)
    ("_scaled_dot_product_flash_attention_backward", dict(query=(32, 12, 47, 64)), [COPY, COPY, 4096 * 12 * 64 * 4, 12 * 4096 * 4]),
    # memory-efficient, 32 x 12 x ceil(47 / 64) = 384 blocks; its forward returns out as a (B, L, N, D) tensor
    # transposed, the kernel's layout: no copy; a contiguous (B, N, L, D) grad_out is copied
    ("_scaled_dot_product_efficient_attention_backward", dict(query=(32, 12, 47, 64)), [384 * 16400, 32 * 12 * 47 * 4]),
    ("_scaled_dot_product_efficient_attention_backward", dict(query=(32, 12, 47, 64), kernel_layout=False), [COPY, 384 * 16400, 32 * 12 * 47 * 4]),
    # 5104 x 12 x ceil(72 / 64) = 122,496 blocks
    ("_scaled_dot_product_efficient_attention_backward", dict(query=(5104, 12, 72, 64)), [122496 * 16400, 5104 * 12 * 72 * 4]),
    # head size 80: one 128 x 128 tile per sequence and head
    ("_scaled_dot_product_efficient_attention_backward", dict(query=(2, 3, 100, 80)), [6 * (16 + 128 * 128 * 4), 2 * 3 * 100 * 4]),
]  # fmt: skip


def _attention_backward_arguments(op: str, query: tuple, cu_seqlens: int = 0, kernel_layout: bool = True) -> tuple:
    """Arguments of `aten.<op>` with query, key and value of shape `query` (bf16) on the current device; out and
    grad_out in the layout the op's forward returns (`kernel_layout`), else contiguous."""
    q = torch.empty(query, dtype=torch.bfloat16, device="cuda")
    rng = torch.empty(2, dtype=torch.int64, device="cuda")
    if op == "_flash_attention_backward":
        cu = torch.zeros(cu_seqlens, dtype=torch.int32, device="cuda")
        lse = torch.empty(query[1], query[0], dtype=torch.float32, device="cuda")
        return (q, q, q, q, q, lse, cu, cu, 64, 64, 0.1, False, rng, rng)
    lse = torch.empty(query[:3], dtype=torch.float32, device="cuda")
    if op == "_scaled_dot_product_flash_attention_backward":
        return (q, q, q, q, q, lse, None, None, query[2], query[2], 0.1, False, rng, rng)
    out = q.transpose(1, 2).contiguous().transpose(1, 2) if kernel_layout else q
    mask = torch.empty(query[0], query[1], query[2], query[2], dtype=torch.bfloat16, device="cuda")
    return (out, q, q, q, mask, out, lse, rng, rng, 0.1, [True, True, True, False], False)


@pytest.mark.parametrize(("op", "shapes", "expected"), WORKSPACES)
def test_the_attention_backward_workspace_is_held_while_the_op_runs(op, shapes, expected):
    """The tracker counts the kernel's workspaces beside the op's gradients, at the peak, and frees them as the op
    returns: they add to the peak only while one attention backward runs."""
    import estimate_gpu_memory

    func = getattr(torch.ops.aten, op).default
    with fake_cuda.FakeGPU():
        args = _attention_backward_arguments(op, **shapes)
        assert estimate_gpu_memory.attention_backward_workspace(func, args) == expected
        tracker = estimate_gpu_memory.AttentionWorkspaceTracker()
        with tracker:
            grads = func(*args)
            after = tracker.get_tracker_snapshot()[torch.device("cuda", 0)]["Total"]
    held = sum(-(-size // 512) * 512 for size in expected)  # in the caching allocator's 512-byte blocks
    outputs = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in grads if t is not None}
    gradients = sum(-(-size // 512) * 512 for size in outputs.values())
    assert after == gradients  # the workspaces are gone once the op returned
    assert tracker.get_tracker_snapshot("peak")[torch.device("cuda", 0)]["Total"] == gradients + held
    assert tracker.workspace_bytes == held and tracker.peak_in_workspace == gradients + held


def test_the_workspace_raises_the_peak_where_it_falls_in_the_attention_backward():
    """A narrow layer with a short FFN on 256 snippets: seqbert's peak is reached in the attention backward, where
    flash's dq_accum for T + 128 S rows (five times the real tokens) outweighs the FFN's activations, which are freed
    by then. With the workspace the peak rises, by at most the workspace; without it (the meta kernels alone) it is
    elsewhere. BERT's workspace matches the memory-efficient kernel's for the padded batch."""
    import estimate_gpu_memory

    bert = BertConfig(num_labels=2, hidden_size=128, num_attention_heads=2, intermediate_size=32, num_hidden_layers=1)
    bert._attn_implementation = "sdpa"
    configs = {"seqbert": seqbert.SeqBertConfig.from_bert_config(bert), "bert": bert}
    batch = estimate_gpu_memory.Batches()("snippets", 256)
    mask = batch["attention_mask"]
    real, (size, length) = int(mask.sum()), mask.shape
    rows = real + 128 * size
    blocks = lambda sizes: sum(-(-n // 512) * 512 for n in sizes)  # noqa: E731
    expected = {
        "seqbert": blocks([rows * 2 * 64 * 4, 2 * rows * 4]),
        "bert": blocks([size * 2 * -(-length // 64) * 16400, size * 2 * length * 4]),
    }
    for name, config in configs.items():
        cost, tracker = estimate_gpu_memory.estimate(name, config, batch)
        assert tracker.workspace_bytes == expected[name], name
        if name == "seqbert":
            with mock.patch.object(estimate_gpu_memory, "attention_backward_workspace", lambda func, args: []):
                without, untracked = estimate_gpu_memory.estimate(name, config, batch)
            assert untracked.workspace_bytes == 0 and untracked.peak_in_workspace == 0
            assert tracker.peak_in_workspace == cost.peak_bytes  # the peak is in the attention backward
            assert 0 < cost.peak_bytes - without.peak_bytes <= tracker.workspace_bytes
            assert cost.flops == without.flops


def test_the_largest_batch_search():
    import estimate_gpu_memory

    cost = lambda batch: 1000 + 50 * batch + (batch // 64) * 500  # noqa: E731  (steps, as padding grows)
    for capacity in (1000, 5000, 60000, 1e6):
        expected = max((b for b in range(8, 20000, 8) if cost(b) <= capacity), default=0)
        for guess in (1, expected / 2, expected, 3 * expected + 100):
            assert estimate_gpu_memory.largest_batch(cost, capacity, guess) == expected, (capacity, guess)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch_sizes", "32"], r"--batch_sizes \(\[32\]\) must hold two or more different sizes"),
        (["--cards_gib", "0"], r"--cards_gib \(\[0.0\]\) must be positive"),
        (["--num_hidden_layers", "0"], r"--num_hidden_layers \(0\) must be >= 1"),
        (["--on_gpu"], r"--on_gpu needs a CUDA GPU, and torch.cuda.is_available\(\) is False here"),
    ],
)
def test_the_estimate_refuses_bad_arguments_naming_them(argv, message, tmp_path):
    import estimate_gpu_memory

    from seqbert.script_utils import ScriptInputError

    with pytest.raises(ScriptInputError, match=message):
        estimate_gpu_memory.main([*argv, "--json_file", str(tmp_path / "estimate.json")])
    assert not (tmp_path / "estimate.json").exists()
