"""The CUDA dry run: seqbert's CUDA code executed in every CI run, on a CPU, on fake CUDA tensors (`fake_cuda.py`).

Each flow builds the model on one fake H100 (compute capability 9.0), feeds it real Rotten Tomatoes snippets through
the MiniLM tokenizer, runs the forward (and the backward of a training step, with labels and BERT's attention dropout
0.1) through torch's real meta kernels, and asserts:

- outputs, loss and gradients are CUDA tensors; no op mixed devices (FakeTensorMode raises) and no tensor of one or
  more dimensions was created on the CPU inside the path (`fake_cuda.CudaPathCheck`);
- the variable-length flash kernel ran once a layer forward and once backward where the path applies (zero where the
  fallback or the padded decoder runs), every call within the kernel's argument contract;
- the host was read once per forward or training step (the reads are served from a CPU run of the same batch: a read
  the CPU run did not make fails).

Flows: an inference forward; the training step of every head (sequence and token classification, question answering,
multiple choice, sparse masked LM, causal LM, seq2seq); packed rows from `DataCollatorWithFlattening` with and without
`cu_seq_lens_q`; gradient checkpointing; fp16 and bf16 weights; fp32 weights under bf16 autocast (what
`Trainer(bf16=True)` runs); the fallback (projections returning another dtype); pre-LN and post-LN; the seq2seq
decoder's cached step. Then the planted faults the dry run must catch: a CPU tensor inside the path, int64
`cu_seqlens`, a second host read, training sent to the fallback.

Needs a C++ compiler for the fake device (`fake_cuda_shim.py`): without one the module skips, naming what is missing;
CI sets `SEQBERT_REQUIRE_CUDA_DRY_RUN=1`, under which a skip is a failure. The real GPU tests are `tests/test_cuda.py`.
"""

import contextlib
import dataclasses

import fake_cuda
import fake_cuda_shim
import pytest
import torch
from transformers import BertForSequenceClassification, DataCollatorWithFlattening

import seqbert
from seqbert import attention_backends
from seqbert.attention_backends import UnpaddedBatch
from seqbert.transformers_compat import CACHE_NAME


if fake_cuda_shim.unavailable is not None:
    if fake_cuda_shim.required():
        raise RuntimeError(
            f"{fake_cuda_shim.REQUIRED_VARIABLE} is set, but the CUDA dry run cannot run: {fake_cuda_shim.unavailable}"
        )
    pytest.skip(fake_cuda_shim.unavailable, allow_module_level=True)


LAYERS = 2


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
    """A flow's outcome on the fake GPU: the model, its output, what the path check saw and the host reads served."""

    model: torch.nn.Module
    output: object
    record: fake_cuda.PathRecord
    reads: list[fake_cuda.HostRead]


def _loss(output) -> torch.Tensor:
    return output.loss if getattr(output, "loss", None) is not None else output[0].float().sum()


def dry_run(
    model_class,
    config,
    batch: dict,
    dtype: torch.dtype = torch.bfloat16,
    train: bool = True,
    autocast: bool = False,
    prepare=lambda model: None,
    kernels: int | None = LAYERS,
    host_reads: int = 1,
) -> DryRun:
    """
    One forward (with `train`, and backward) of `model_class(config)` on the fake GPU, weights in `dtype`, under
    bf16 autocast with `autocast`; `prepare(model)` runs on both the CPU model (whose host reads are served) and the
    fake one. Asserts (raising `fake_cuda.CudaPathFault`) the devices of outputs and gradients, `kernels` flash calls
    forward (and backward), and `host_reads` reads; the contract and CPU-tensor checks raise on their own.
    """
    cpu_model = model_class(config).train(train)
    prepare(cpu_model)
    cpu_batch = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def cpu_step():
        output = cpu_model(**cpu_batch)
        if train:
            _loss(output).backward()

    reads = fake_cuda.record_host_reads(cpu_step)
    with fake_cuda.FakeGPU(reads) as gpu, fake_cuda.GpuSdpaChoice():
        model = gpu.model(model_class, config, dtype).train(train)
        prepare(model)
        inputs = gpu.tensors(batch)
        with fake_cuda.checked() as record:
            with gpu.autocast() if autocast else contextlib.nullcontext():
                output = model(**inputs)
            if train:
                _loss(output).backward()
        served = gpu.reads.served
        _check_devices(model, output, train)
    if len(served) != host_reads:
        raise fake_cuda.CudaPathFault(
            f"{len(served)} host reads, expected {host_reads}: " + "; ".join(r.where for r in served)
        )
    if kernels is not None and record.flash_forward != kernels:
        raise fake_cuda.CudaPathFault(f"the flash kernel ran {record.flash_forward} times forward, expected {kernels}")
    if kernels is not None and train and record.flash_backward != kernels:
        raise fake_cuda.CudaPathFault(
            f"the flash kernel ran {record.flash_backward} times backward, expected {kernels}"
        )
    return DryRun(model, output, record, served)


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
# Flows
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_inference_forward(snippets, norm_placement, dtype):
    run = dry_run(seqbert.SeqBertModel, tiny_config(norm_placement=norm_placement), snippets, dtype, train=False)
    hidden = run.output.last_hidden_state
    assert hidden.shape == (*snippets["input_ids"].shape, 64) and hidden.dtype == dtype
    assert run.output.pooler_output.shape == (8, 64)


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


def test_training_step_of_the_causal_lm(snippets):
    """Decoder-only (BERT's `BertLMHeadModel`): causal self-attention on the padded batch, through sdpa (the kernel
    a GPU picks), not the variable-length one."""
    labels = snippets["input_ids"].masked_fill(snippets["attention_mask"] == 0, -100)
    batch = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"], "labels": labels}
    run = dry_run(seqbert.SeqBertForCausalLM, tiny_config(), batch, kernels=0)
    assert run.output.logits.shape == (*labels.shape, 30522)


def _seq2seq_config(**overrides):
    return tiny_config(is_encoder_decoder=True, num_decoder_layers=LAYERS, decoder_start_token_id=101, **overrides)


def test_training_step_of_the_seq2seq_model(snippets):
    """Encoder on the variable-length kernel, decoder (causal self-attention, cross-attention) on sdpa."""
    labels = snippets["input_ids"][:, :12].masked_fill(snippets["attention_mask"][:, :12] == 0, -100)
    batch = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"], "labels": labels}
    run = dry_run(seqbert.SeqBertForConditionalGeneration, _seq2seq_config(), batch)
    assert run.output.logits.shape == (8, 12, 30522)


def test_the_seq2seq_decoders_cached_step(snippets):
    """A generation step after the first: the decoder reads its self-attention cache and the cross-attention keys
    and values computed on the first step; no encoder run, no variable-length kernel."""
    config = _seq2seq_config()
    source = {"input_ids": snippets["input_ids"], "attention_mask": snippets["attention_mask"]}
    start = torch.full((8, 1), 101)

    def two_steps(model):
        encoder_outputs = model.get_encoder()(**source)
        first = model(**source, encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
        return model(
            attention_mask=source["attention_mask"],
            encoder_outputs=encoder_outputs,
            decoder_input_ids=first.logits[:, -1:].argmax(-1),
            **{CACHE_NAME: getattr(first, CACHE_NAME)},
            use_cache=True,
        )

    # The first step's reads (encoder, decoder) come from the CPU run of the same two steps.
    reads = fake_cuda.record_host_reads(lambda: two_steps(seqbert.SeqBertForConditionalGeneration(config).eval()))
    with fake_cuda.FakeGPU(reads) as gpu, fake_cuda.GpuSdpaChoice():
        model = gpu.model(seqbert.SeqBertForConditionalGeneration, config, torch.bfloat16).eval()
        source = gpu.tensors(source)
        start = gpu.tensor(start)
        with torch.no_grad(), fake_cuda.checked() as record:
            encoder_outputs = model.get_encoder()(**source)
            first = model(**source, encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
            before = (len(gpu.reads.served), record.flash_forward)
            step = model(
                attention_mask=source["attention_mask"],
                encoder_outputs=encoder_outputs,
                decoder_input_ids=first.logits[:, -1:].argmax(-1),
                **{CACHE_NAME: getattr(first, CACHE_NAME)},
                use_cache=True,
            )
        assert step.logits.shape == (8, 1, 30522) and step.logits.device.type == "cuda"
        assert getattr(step, CACHE_NAME).get_seq_length() == 2
        assert record.flash_forward == before[1] == LAYERS  # the encoder only
        assert len(gpu.reads.served) - before[0] <= 1, gpu.reads.served[before[0] :]


@pytest.mark.parametrize("cu_seq_lens", [False, True], ids=["position_ids", "cu_seq_lens_q"])
def test_packed_rows_from_the_flattening_collator(tokenizer, rt_texts, cu_seq_lens):
    """One row of 8 snippets with restarting `position_ids` (and `cu_seq_lens_q` / `max_length_q` when the collator
    is asked for them), token-classification labels: each sequence attends to itself only, through the kernel."""
    features = [
        {"input_ids": ids, "labels": [i % 3] * len(ids)} for i, ids in enumerate(tokenizer(rt_texts[:8])["input_ids"])
    ]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=cu_seq_lens)(features)
    batch = {k: v for k, v in batch.items() if k not in ("cu_seq_lens_k", "max_length_k")}
    if cu_seq_lens:
        assert batch["cu_seq_lens_q"].numel() == 9
    run = dry_run(seqbert.SeqBertForTokenClassification, tiny_config(num_labels=3), batch)
    assert run.output.logits.shape == (*batch["input_ids"].shape, 3)


def test_gradient_checkpointing(snippets):
    """Each layer's forward runs again in backward: the kernel twice a layer forward, once backward, still one
    host read."""
    batch = {**snippets, **_labels("sequence", snippets)}
    model_class, config = seqbert.SeqBertForSequenceClassification, tiny_config()
    record = None

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
    run = dry_run(seqbert.SeqBertForSequenceClassification, tiny_config(), batch, prepare=_float_values, kernels=0)
    assert run.record.ops["aten._scaled_dot_product_efficient_attention.default"] == LAYERS


# ----------------------------------------------------------------------------------------------------------------------
# Planted faults: each must make the dry run fail
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def training_step(snippets):
    batch = {**snippets, **_labels("sequence", snippets)}
    return lambda: dry_run(seqbert.SeqBertForSequenceClassification, tiny_config(), batch)


def test_the_unplanted_step_passes(training_step):
    assert training_step().record.flash_forward == LAYERS


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


def test_a_second_host_read_fails(training_step, monkeypatch):
    """The number of real tokens read again after the layout's read, as a check might."""
    encode = seqbert.SeqBertModel._encode_unpadded

    def planted(self, unpadded, *args, **kwargs):
        assert unpadded.indices.shape[0] == int(unpadded.cu_seqlens[-1].item())
        return encode(self, unpadded, *args, **kwargs)

    monkeypatch.setattr(seqbert.SeqBertModel, "_encode_unpadded", planted)
    with pytest.raises(
        fake_cuda.CudaPathFault, match=r"2 host reads, expected 1: .*; test_cuda_dry_run.py:\d+ planted"
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


def test_training_sent_to_the_fallback_fails(training_step, monkeypatch):
    """The variable-length path refused where attention dropout is drawn, as before the kernel took dropout."""
    applies = attention_backends.varlen_attention_applies
    monkeypatch.setattr(
        seqbert.modeling_seqbert,
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
