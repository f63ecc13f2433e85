"""Branches of modeling_seqbert.py and convert_bert.py that the rest of the suite left uncovered (README, "Testing":
coverage): the rarer error messages, a tuple `encoder_outputs`, explicit decoder masks next to labels, PEFT's target
table registered by hand, and damaged pickled-weight files and weight indexes. Each case checks behaviour: the error
names the argument, or the result equals the common path's."""

import json
import zipfile

import pytest
import torch
from conftest import tiny_config

import seqbert
from seqbert import checkpoint_loading, convert_bert
from seqbert.modeling_seqbert import loss_divisor
from seqbert.peft_integration import register_peft_target_modules
from seqbert.transformers_compat import CACHE_NAME


def seq2seq_model():
    torch.manual_seed(0)
    config = tiny_config(is_encoder_decoder=True, decoder_start_token_id=1, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)  # fmt: skip
    return seqbert.SeqBertForConditionalGeneration(config).eval()


def test_decoder_needs_the_encoder_states_it_attends_to():
    model = seq2seq_model()
    with pytest.raises(ValueError, match="the decoder needs encoder_hidden_states"):
        model.decoder(torch.tensor([[1, 5]]))


def test_a_prepared_decoder_mask_over_too_few_keys_is_refused():
    model = seq2seq_model()
    encoder_states = model.get_encoder()(torch.tensor([[5, 6, 7]])).last_hidden_state
    cache = getattr(model.decoder(torch.tensor([[1, 5]]), encoder_hidden_states=encoder_states, use_cache=True),
                    CACHE_NAME)  # fmt: skip
    short = torch.zeros(1, 1, 1, 2)  # covers the 2 cached positions, not the new one
    with pytest.raises(ValueError, match="prepared 4D mask over 2 key positions"):
        model.decoder(torch.tensor([[6]]), attention_mask=short, encoder_hidden_states=encoder_states, cache=cache)


def test_encoder_outputs_as_a_tuple_and_explicit_decoder_mask_give_the_same_loss():
    """`encoder_outputs` as a tuple (what `return_dict=False` returns) and a `decoder_attention_mask` given next to
    `labels` give what the model computes from `input_ids` and the mask it builds from the labels."""
    model = seq2seq_model()
    source, labels = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10, 11]])
    expected = model(input_ids=source, labels=labels)
    encoder_tuple = model.get_encoder()(input_ids=source, return_dict=False)
    assert isinstance(encoder_tuple, tuple)
    got = model(encoder_outputs=encoder_tuple, labels=labels, decoder_attention_mask=torch.ones(1, 3, dtype=torch.long))
    assert torch.equal(got.logits, expected.logits) and torch.equal(got.loss, expected.loss)


@pytest.mark.parametrize("value", [2.0, True, "4"])
def test_generate_counts_must_be_ints(value):
    model = seq2seq_model()
    with pytest.raises(TypeError, match=rf"num_beams must be an int, got {value!r}"):
        model.generate(torch.tensor([[5, 6]]), num_beams=value, max_new_tokens=2)


def test_generate_token_ids_must_be_ints():
    model = seq2seq_model()
    with pytest.raises((TypeError, ValueError), match="bad_words_ids"):
        model.generate(torch.tensor([[5, 6]]), bad_words_ids=[[1.5]], max_new_tokens=2)


def test_resizing_the_vocabulary_to_nothing_is_refused():
    model = seqbert.SeqBertForMaskedLM(tiny_config())
    with pytest.raises(ValueError, match=r"new_num_tokens \(0\) must be >= 1"):
        model.resize_token_embeddings(0)
    assert model.get_input_embeddings().num_embeddings == tiny_config().vocab_size


def test_loss_divisor_with_an_int_count_is_never_below_one():
    labels = torch.tensor([[-100, 3, 4]])
    assert loss_divisor(labels) == 2
    assert loss_divisor(labels, num_items_in_batch=7) == 7
    assert loss_divisor(labels, num_items_in_batch=0) == 1
    assert torch.equal(loss_divisor(labels, num_items_in_batch=torch.tensor(0)), torch.tensor(1))


def test_peft_target_modules_registered_by_hand():
    """`register_peft_target_modules()` without a table imports peft's and adds seqbert's entries, as the import hook
    does when peft is imported after seqbert; calling it again changes nothing."""
    from peft.utils import constants

    register_peft_target_modules()
    tables = {name: dict(table) for name, table in vars(constants).items() if isinstance(table, dict)}
    register_peft_target_modules()
    assert any("seqbert" in table for table in tables.values())
    assert tables == {name: dict(table) for name, table in vars(constants).items() if isinstance(table, dict)}


# checkpoint_loading: damaged weight files and indexes


def test_an_empty_pickled_weights_file_is_named(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"")
    assert "0 bytes" in checkpoint_loading.weights_file_problem(path)


def test_a_truncated_torch_save_archive_is_named(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(64)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "end is missing" in checkpoint_loading.weights_file_problem(path)


def test_a_torch_save_archive_with_a_bad_checksum_is_named(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(64)}, path)
    with zipfile.ZipFile(path) as archive:
        member = next(info for info in archive.infolist() if info.filename.endswith("/data/0"))
    data = bytearray(path.read_bytes())
    name_length, extra_length = (int.from_bytes(data[member.header_offset + i : member.header_offset + i + 2], "little")
                                 for i in (26, 28))  # fmt: skip
    data[member.header_offset + 30 + name_length + extra_length + 3] ^= 0xFF  # a byte of the member's data
    path.write_bytes(bytes(data))
    assert "fails its checksum" in checkpoint_loading.weights_file_problem(path)


def test_a_legacy_pickle_is_not_judged_without_unpickling(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(4)}, path, _use_new_zipfile_serialization=False)
    assert checkpoint_loading.weights_file_problem(path) is None


@pytest.mark.parametrize("index", [{}, {"weight_map": {}}, [1, 2]])
def test_a_weight_index_without_a_weight_map_is_named(tmp_path, index):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    with pytest.raises(OSError, match="no weight_map naming the shard files"):
        checkpoint_loading._index_shards(path)


def test_encoder_decoder_configs_seqbert_cannot_take_are_refused():
    from transformers import BertConfig, EncoderDecoderConfig, GPT2Config

    bert = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    gpt2 = GPT2Config(n_embd=32, n_layer=2, n_head=4)
    with pytest.raises(ValueError, match="decoder"):
        convert_bert._seq2seq_config_from_encoder_decoder(
            EncoderDecoderConfig.from_encoder_decoder_configs(bert, gpt2), {}
        )
    tied = EncoderDecoderConfig.from_encoder_decoder_configs(bert, bert, tie_encoder_decoder=True)
    with pytest.raises(ValueError, match=r"tie_encoder_decoder \(True\) is not supported"):
        convert_bert._seq2seq_config_from_encoder_decoder(tied, {})


def test_a_4d_encoder_mask_takes_the_padded_path_with_the_same_result():
    """A prepared (B, 1, L, L) mask skips the unpadded fast path (which needs the (B, L) layout) and gives what the
    (B, L) mask gives on the real tokens; a 4D mask of another length is refused."""
    torch.manual_seed(0)
    model = seqbert.SeqBertModel(tiny_config(attn_implementation="sdpa")).eval()
    ids, mask = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]]), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    expected = model(ids, attention_mask=mask).last_hidden_state
    mask_4d = mask.bool()[:, None, None, :].expand(2, 1, 4, 4)
    got = model(ids, attention_mask=mask_4d).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 1, 3, 3\)"):
        model(ids, attention_mask=mask_4d[:, :, :3, :3])
    # Found writing this test: a 4D mask of 1s and 0s reached sdpa and failed deep in torch.
    with pytest.raises(TypeError, match="prepared 4D mask of dtype torch.int64"):
        model(ids, attention_mask=mask_4d.long())


def test_multiple_choice_takes_exactly_one_of_ids_and_embeddings():
    model = seqbert.SeqBertForMultipleChoice(tiny_config())
    ids = torch.tensor([[[5, 6], [7, 8]]])
    with pytest.raises(ValueError, match="got both"):
        model(input_ids=ids, inputs_embeds=torch.zeros(1, 2, 2, tiny_config().hidden_size))
    with pytest.raises(ValueError, match="got neither"):
        model()


def test_generate_token_ids_given_as_a_float_tensor_are_refused():
    model = seq2seq_model()
    with pytest.raises((TypeError, ValueError), match="suppress_tokens"):
        model.generate(torch.tensor([[5, 6]]), suppress_tokens=torch.tensor([1.5]), max_new_tokens=2)


def test_one_row_of_token_types_stands_for_every_row_on_the_unpadded_path():
    """Found by the fuzz campaign: (1, L) `token_type_ids` with packed `position_ids` (which take the unpadded fast
    path) failed with an IndexError; they stand for every row, as on the padded path (eager attention)."""
    torch.manual_seed(0)
    fast = seqbert.SeqBertModel(tiny_config(attn_implementation="sdpa")).eval()
    eager = seqbert.SeqBertModel(tiny_config(attn_implementation="eager")).eval()
    eager.load_state_dict(fast.state_dict())
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    token_types, positions = torch.tensor([[0, 0, 1, 1]]), torch.tensor([[0, 1, 0, 1]])  # two packed pairs per row
    got = fast(ids, token_type_ids=token_types, position_ids=positions).last_hidden_state
    assert torch.equal(
        got, fast(ids, token_type_ids=token_types.expand(2, 4), position_ids=positions).last_hidden_state
    )
    reference = eager(ids, token_type_ids=token_types, position_ids=positions).last_hidden_state
    torch.testing.assert_close(got, reference, rtol=0, atol=1e-5)
