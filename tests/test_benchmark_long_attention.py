"""scripts/benchmarks/benchmark_long_attention.py: its arguments are checked before anything is built (a one-line
refusal naming the argument and value), and the compiled-attention variant it times is wired into the optimized
layers without changing the model it was built from. No timing and no compilation here: the benchmark itself takes
minutes."""

import benchmark_long_attention  # noqa: E402  (scripts/benchmarks, on sys.path by conftest)
import pytest
import torch
from conftest import pinned_cpu_plan, tiny_config

import seqbert
from seqbert.cpu_inference import onednn_available
from seqbert.script_utils import ScriptInputError, parse_arguments, script_parser


def _parse(argv: list[str]):
    parser = script_parser(benchmark_long_attention.LongAttentionArguments, benchmark_long_attention.__doc__)
    (args,) = parse_arguments(parser, argv)
    return args


def test_defaults_are_the_issues_workload():
    args = _parse([])
    assert (args.length, args.num_batches, args.batch_size, args.threads) == (512, 3, 8, 2)
    assert args.repeats >= 5
    assert args.models == list(benchmark_long_attention.MODELS)
    assert args.variants == list(benchmark_long_attention.VARIANTS)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--variants", "flash"], "--variants"),
        (["--precisions", "fp16"], "--precisions"),
        (["--models", "bert_large"], "--models"),
        (["--repeats", "0"], "--repeats"),
        (["--length", "1"], "--length"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, named):
    with pytest.raises(ScriptInputError, match=named) as raised:
        benchmark_long_attention.main(argv)
    assert argv[1] in str(raised.value)


@pytest.mark.skipif(not onednn_available(), reason="needs torch's oneDNN operators on an x86 AVX2 CPU")
def test_variant_layers_share_the_optimized_model_and_leave_it_alone():
    torch.manual_seed(0)
    model = seqbert.SeqBertModel(tiny_config(norm_placement="post")).eval()
    # A pinned plan with optimized layers: what the variant wraps, whatever the load on the machine would choose.
    optimized = seqbert.optimize_for_cpu_inference(model, plan=pinned_cpu_plan())
    variant = benchmark_long_attention.AttentionVariant("compiled_sdpa")
    wrapped = benchmark_long_attention.with_attention_variant(optimized, variant)
    for ours, theirs in zip(wrapped.encoder.layers, optimized.encoder.layers, strict=True):
        assert isinstance(ours, benchmark_long_attention._VariantLayer) and ours._variant is variant
        assert not isinstance(theirs, benchmark_long_attention._VariantLayer)
        assert ours._packed is theirs._packed  # packed weights shared, not copied
    assert wrapped.embeddings.word_embeddings.weight is optimized.embeddings.word_embeddings.weight
