"""Hub publishing: saved folders that load with only torch + transformers, the model card, and scripts/hub/push_to_hub.py.

The remote-code tests copy saved folders elsewhere and load them in a separate process in which `import seqbert`
fails (scripts/hub/load_without_seqbert.py), with real MiniLM weights and real review snippets, and compare the outputs with
the in-package models. The upload test runs huggingface_hub's real `HfApi` code with only its HTTP client replaced by
an in-process fake Hub (tests/hub_recorder.py): the Hub is unreachable from this machine.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import push_to_hub  # noqa: E402
import pytest
import torch
from conftest import SCRIPT_PATHS, run_with_seqbert, run_without_seqbert, tiny_config
from hub_recorder import record_hub_requests
from huggingface_hub import ModelCard
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer
from transformers.dynamic_module_utils import get_imports

import seqbert
from seqbert.configuration_seqbert import CAUSAL_LM_AUTO_MAP, ENCODER_AUTO_MAP, SEQ2SEQ_AUTO_MAP
from seqbert.hub import UPLOAD_IGNORE_PATTERNS, count_parameters, upload_files, validate_model_folder


# The code a saved folder carries: the files named by auto_map and, recursively, the files they import relatively.
CODE_FILES = {
    "configuration_seqbert.py",
    "modeling_seqbert.py",
    "convert_bert.py",
    "checkpoint_loading.py",
    "attention_backends.py",
    "input_checks.py",
    "decoder_checks.py",
    "packed_cpu_linears.py",
    "peft_integration.py",
    "transformers_compat.py",
}
ENCODER_HEADS = {
    "AutoModel": seqbert.SeqBertModel,
    "AutoModelForMaskedLM": seqbert.SeqBertForMaskedLM,
    "AutoModelForSequenceClassification": seqbert.SeqBertForSequenceClassification,
    "AutoModelForTokenClassification": seqbert.SeqBertForTokenClassification,
    "AutoModelForQuestionAnswering": seqbert.SeqBertForQuestionAnswering,
    "AutoModelForMultipleChoice": seqbert.SeqBertForMultipleChoice,
}


def _auto_map(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["auto_map"]


@pytest.mark.parametrize("is_encoder_decoder", [False, True], ids=["encoder", "seq2seq"])
def test_save_pretrained_writes_the_code_and_every_fitting_auto_class(tmp_path, is_encoder_decoder):
    if is_encoder_decoder:
        config = tiny_config(is_encoder_decoder=True, decoder_start_token_id=2, eos_token_id=3)
        model = seqbert.SeqBertForConditionalGeneration(config)
    else:
        model = seqbert.SeqBertForTokenClassification(tiny_config(num_labels=3))
    model.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir() if p.suffix == ".py"} == CODE_FILES
    expected = {**ENCODER_AUTO_MAP, **(SEQ2SEQ_AUTO_MAP if is_encoder_decoder else CAUSAL_LM_AUTO_MAP)}
    assert _auto_map(tmp_path) == expected
    # The copied files are the package's own (nothing edited on the way), and they import each other relatively.
    for name in CODE_FILES:
        assert (tmp_path / name).read_bytes() == (Path(seqbert.__file__).parent / name).read_bytes()
    assert validate_model_folder(tmp_path) == [
        "no tokenizer (tokenizer.json or vocab.txt): save the tokenizer into the folder too",
        "no model card (README.md): render one with seqbert.hub.write_model_card",
    ]


def _inputs(tokenizer, texts, path: Path, **extra) -> dict[str, torch.Tensor]:
    batch = dict(tokenizer(texts, padding=True, truncation=True, max_length=48, return_tensors="pt"))
    batch.update(extra)
    save_file({k: v.contiguous() for k, v in batch.items()}, path)
    return batch


def test_every_head_and_generate_match_in_a_process_without_seqbert(
    minilm_path, tokenizer, rt_texts, classification_run, tmp_path
):
    """Real MiniLM weights in every head (heads seeded), saved, copied elsewhere, loaded with trust_remote_code where
    seqbert cannot be imported: identical outputs; seq2seq and causal-LM generate give identical ids. The same for the main job's
    final folder and its Trainer checkpoint, and a Trainer run resumed from that checkpoint without seqbert."""
    texts = rt_texts[:4]
    expected, jobs = {}, []
    plain = _inputs(tokenizer, texts, tmp_path / "plain.safetensors")
    pairs = tokenizer([texts[0]] * 2 + [texts[1]] * 2, texts, padding=True, return_tensors="pt")
    choices = {k: v.view(2, 2, -1).contiguous() for k, v in pairs.items()}
    save_file(choices, tmp_path / "choices.safetensors")
    for auto_class, model_class in ENCODER_HEADS.items():
        torch.manual_seed(0)
        model = model_class.from_bert_pretrained(minilm_path, num_labels=2).eval()
        saved, copied = tmp_path / "saved" / auto_class, tmp_path / "copied" / auto_class
        model.save_pretrained(saved)
        shutil.copytree(saved, copied)
        inputs, inputs_file = (choices, "choices") if auto_class == "AutoModelForMultipleChoice" else (plain, "plain")
        with torch.no_grad():
            output = model(**inputs)
        expected.update({f"{auto_class}.{k}": v for k, v in output.items() if isinstance(v, torch.Tensor)})
        jobs.append(
            {
                "name": auto_class,
                "mode": "forward",
                "folder": str(copied),
                "auto_class": auto_class,
                "inputs": str(tmp_path / f"{inputs_file}.safetensors"),
            }
        )

    torch.manual_seed(0)
    generator = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()
    generator.save_pretrained(tmp_path / "seq2seq")
    shutil.copytree(tmp_path / "seq2seq", tmp_path / "copied" / "seq2seq")
    for name, kwargs in {"greedy": {"max_new_tokens": 8}, "beam": {"max_new_tokens": 8, "num_beams": 3}}.items():
        with torch.no_grad():
            expected[f"{name}.sequences"] = generator.generate(**plain, **kwargs)
        jobs.append(
            {
                "name": name,
                "mode": "generate",
                "folder": str(tmp_path / "copied" / "seq2seq"),
                "inputs": str(tmp_path / "plain.safetensors"),
                "auto_class": "AutoModelForSeq2SeqLM",
                "generate_kwargs": kwargs,
            }
        )
    # The decoder-only model: MiniLM's body as causal layers, a seeded LM head.
    torch.manual_seed(0)
    causal = seqbert.SeqBertForCausalLM.from_bert_pretrained(minilm_path).eval()
    causal.save_pretrained(tmp_path / "copied" / "causal")
    with torch.no_grad():
        expected["causal.sequences"] = causal.generate(**plain, max_new_tokens=6)
    jobs.append(
        {
            "name": "causal",
            "mode": "generate",
            "folder": str(tmp_path / "copied" / "causal"),
            "inputs": str(tmp_path / "plain.safetensors"),
            "auto_class": "AutoModelForCausalLM",
            "generate_kwargs": {"max_new_tokens": 6},
        }
    )

    # The main job's output folder and its Trainer checkpoint.
    checkpoint = classification_run / "checkpoint-2"
    for name, folder in (("final", classification_run), ("checkpoint", checkpoint)):
        model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        assert type(model) is seqbert.SeqBertForSequenceClassification
        with torch.no_grad():
            expected[f"{name}.logits"] = model(**plain).logits
        jobs.append(
            {
                "name": name,
                "mode": "forward",
                "folder": str(folder),
                "auto_class": "AutoModelForSequenceClassification",
                "inputs": str(tmp_path / "plain.safetensors"),
            }
        )
    # The main job's tokenizer, as a Hub user without seqbert loads it: no prompt and no warning (run_without_seqbert
    # checks the output), the same ids as here.
    expected["tokenizer.input_ids"] = tokenizer(texts, padding=True, return_tensors="pt")["input_ids"]
    expected["tokenizer.class_input_ids"] = expected["tokenizer.input_ids"]
    jobs.append({"name": "tokenizer", "mode": "tokenize", "folder": str(classification_run), "texts": texts})
    resumed = tmp_path / "resumed"
    jobs.append(
        {
            "name": "resume",
            "mode": "resume",
            "checkpoint": str(checkpoint),
            "texts": rt_texts[:24],
            "labels": [i % 2 for i in range(24)],
            "max_steps": 3,
            "output_dir": str(resumed),
        }
    )

    outputs = run_without_seqbert(jobs, tmp_path)
    assert outputs.pop("resume.global_step").item() == 3
    # Bit for bit against the same jobs run with the installed seqbert in another fresh process: the two start alike
    # (interpreter, torch, environment, threads), so they run the same kernels in the same order on any CPU. This
    # process is held to a tolerance instead: bit-equality with a fresh process holds only while nothing has changed
    # its threads or kernels, which no test may do (conftest's no_leaked_process_state). When CTranslate2's Encoder
    # left torch on 1 thread (tests/test_benchmark_engines.py, before its fix), MKL on a Sapphire Rapids Xeon summed
    # in another order and these hidden states differed from the subprocess's by 2.6e-6.
    for key in ("tokenizer.input_ids", "tokenizer.class_input_ids"):
        assert torch.equal(outputs.pop(key), expected.pop(key)), key
    reference = run_with_seqbert(jobs, tmp_path)
    assert set(outputs) == set(reference) == set(expected)
    for key, value in reference.items():
        assert torch.equal(outputs[key], value), (key, (outputs[key] - value).abs().max())
        if value.is_floating_point():
            torch.testing.assert_close(expected[key], value, rtol=0, atol=1e-4, msg=key)
        else:  # generated ids
            assert torch.equal(expected[key], value), key
    # A folder saved by remote code (no seqbert) carries the code and the full auto_map again.
    assert CODE_FILES <= {p.name for p in resumed.iterdir()}
    assert _auto_map(resumed) == {**ENCODER_AUTO_MAP, **CAUSAL_LM_AUTO_MAP}


def test_trainer_checkpoints_carry_the_code(classification_run):
    checkpoint = classification_run / "checkpoint-2"
    assert CODE_FILES <= {p.name for p in checkpoint.iterdir()}
    assert _auto_map(checkpoint) == {**ENCODER_AUTO_MAP, **CAUSAL_LM_AUTO_MAP}
    assert not list(checkpoint.glob("pytorch_model*.bin"))


def test_pickled_weights_need_an_explicit_opt_in(tmp_path):
    model = seqbert.SeqBertForSequenceClassification(tiny_config(num_labels=2)).eval()
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickled PyTorch weights \(pytorch_model.bin\).*use_safetensors=False"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="use_safetensors=False"):
        seqbert.SeqBertForSequenceClassification.from_pretrained(tmp_path / "pytorch_model.bin", config=model.config)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path, use_safetensors=False).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    model.save_pretrained(tmp_path / "saved")
    saved = {p.name for p in (tmp_path / "saved").iterdir()}
    assert "model.safetensors" in saved and not any(name.endswith(".bin") for name in saved), saved


def test_classification_card_metadata_and_text_come_from_the_run(classification_run):
    card = ModelCard.load(classification_run / "README.md")
    data = card.data.to_dict()
    results = json.loads((classification_run / "all_results.json").read_text())
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-classification"
    assert {"seqbert", "custom_code"} <= set(data["tags"])
    assert data["license"] == "apache-2.0" and data["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert data["metrics"] == ["accuracy"]
    (entry,) = data["model-index"][0]["results"]
    assert entry["task"]["type"] == "text-classification"
    assert entry["metrics"][0]["value"] == pytest.approx(results["eval_accuracy"])
    model = AutoModel.from_pretrained(classification_run)
    full = AutoModelForSequenceClassification.from_pretrained(classification_run)
    count = sum(p.numel() for p in full.parameters())
    assert count_parameters(classification_run) == (count, "float32")
    text = card.text
    assert f"{count:,}" in text and "post-LN" in text and f"{model.config.num_hidden_layers} encoder" in text
    assert "![Training loss](loss_curve.png)" in text and (classification_run / "loss_curve.png").is_file()
    assert 'revision = "<commit sha>"' in text
    assert "AutoTokenizer.from_pretrained(repo_id, revision=revision, trust_remote_code=True)" in text
    assert (
        "AutoModelForSequenceClassification.from_pretrained(repo_id, revision=revision, trust_remote_code=True)" in text
    )
    assert "run_classification.py --output_dir" in text and "5e-05" in text
    assert "## Serving without seqbert" not in text  # only a folder with serving files (push --serving_artifacts)
    assert "2 cores" in text or "GPU" in text


def test_the_cards_loading_snippet_runs_and_truncates_as_the_card_says(classification_run, rt_texts, tmp_path):
    """The card's own snippet, pointed at the folder instead of the Hub, on a text of 600+ tokens: it truncates to the
    training length (the card says so) instead of failing past the position table; the card's grammar holds."""
    card = ModelCard.load(classification_run / "README.md")
    snippet = card.text.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = re.sub(r'repo_id = ".*"', f"repo_id = {str(classification_run)!r}", snippet)
    snippet = snippet.replace('"A gripping, funny film."', "long_text")
    long_text = " ".join(rt_texts[:40])
    namespace = {"long_text": long_text}
    exec(compile(snippet.replace("revision=revision, ", ""), "README.md", "exec"), namespace)  # noqa: S102
    assert len(namespace["tokenizer"](long_text)["input_ids"]) > 600
    assert namespace["inputs"]["input_ids"].shape == (1, 128) and namespace["logits"].shape == (1, 2)
    assert "`model_max_length` is 128: with `truncation=True`" in card.text
    assert "1 processes" not in card.text and "(32 per device x 1 process x 1 accumulation step)" in card.text
    assert "seqbert_version" not in card.text and f"seqbert {seqbert.__version__}" in card.text


def test_seq2seq_card_reports_bleu_next_to_the_copy_baseline(seq2seq_run):
    card = ModelCard.load(seq2seq_run / "README.md")
    data = card.data.to_dict()
    results = json.loads((seq2seq_run / "all_results.json").read_text())
    assert data["pipeline_tag"] == "text2text-generation" and data["metrics"] == ["bleu", "chrf"]
    scores = {m["name"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}
    scores.update({m["name"]: m["value"] for r in data["model-index"][0]["results"][1:] for m in r["metrics"]})
    assert scores["sacreBLEU"] == round(results["predict_bleu"], 2)
    assert f"| {round(results['copy_baseline_bleu'], 2):.4g} |" in card.text
    assert "AutoModelForSeq2SeqLM" in card.text and "generate(" in card.text


def _copy_run(classification_run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(classification_run, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    return folder


def test_main_job_folder_is_ready_to_push(classification_run):
    assert validate_model_folder(classification_run) == []
    uploaded = {path for path, _ in upload_files(classification_run)}
    assert {"README.md", "model.safetensors", "tokenizer.json", "loss_curve.png", *CODE_FILES} <= uploaded
    assert not any(p.startswith("checkpoint-") or p == "training_args.bin" for p in uploaded), uploaded


@pytest.mark.parametrize(
    "break_folder, message",
    [
        (lambda d: (d / "modeling_seqbert.py").unlink(), "modeling_seqbert.py is missing"),
        (lambda d: (d / "convert_bert.py").unlink(), "convert_bert.py is missing"),
        (lambda d: _drop_auto_map_entry(d, "AutoModel"), "auto_map has no 'AutoModel' entry"),
        (lambda d: (d / "model.safetensors").unlink(), "no safetensors weights"),
        (lambda d: _truncate(d / "model.safetensors"), "model.safetensors is truncated or corrupt"),
        (lambda d: (d / "README.md").unlink(), "no model card (README.md)"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
        (lambda d: (d / "pytorch_model.bin").write_bytes(b"pickle"), "pickled files would be uploaded"),
    ],
    ids=["modeling", "relative-import", "auto_map", "weights", "truncated-weights", "card", "tokenizer", "pickle"],
)
def test_push_rejects_an_incomplete_folder_before_touching_the_hub(
    classification_run, tmp_path, capsys, break_folder, message
):
    folder = _copy_run(classification_run, tmp_path)
    break_folder(folder)
    with record_hub_requests() as hub:
        status = push_to_hub.main(["--model_dir", str(folder), "--repo_id", "someone/seqbert-rt"])
    assert status == 1
    error = capsys.readouterr().err
    assert f"model_dir ({str(folder)!r}) is not ready to push" in error and message in error
    assert hub.created_repos == [] and hub.commits == []


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _drop_auto_map_entry(folder: Path, auto_class: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"][auto_class]
    (folder / "config.json").write_text(json.dumps(config))


def test_push_command_exits_non_zero_on_a_bad_folder(tmp_path, capsys):
    """The command as users run it (a fresh process: its exit status, no traceback), then `main` on another bad
    argument, which reports it the same way."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    command = [sys.executable, str(SCRIPT_PATHS["push_to_hub.py"]), "--model_dir", str(tmp_path)]
    result = subprocess.run([*command, "--repo_id", "someone/x"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "model_type 'bert', not 'seqbert'" in result.stderr and "Traceback" not in result.stderr
    with record_hub_requests() as hub:
        assert push_to_hub.main(["--model_dir", str(tmp_path), "--repo_id", "not a repo id"]) == 1
    assert "repo_id ('not a repo id') is not a valid Hub repository id" in capsys.readouterr().err
    assert hub.created_repos == [] and hub.commits == []


def test_dry_run_lists_the_files_and_sizes_and_uploads_nothing(classification_run, capsys):
    with record_hub_requests() as hub:
        status = push_to_hub.main(["--model_dir", str(classification_run), "--repo_id", "someone/x", "--dry_run"])
    assert status == 0
    out = capsys.readouterr().out
    for path, size in upload_files(classification_run):
        assert f"{size:>12,d} bytes" in out and path in out
    assert "checkpoint-2" not in out and "Dry run: nothing was uploaded." in out
    assert hub.created_repos == [] and hub.commits == []


def test_upload_goes_through_huggingface_hub_and_pins_the_card_to_the_commit(classification_run, tmp_path, capsys):
    folder = _copy_run(classification_run, tmp_path)
    shutil.copytree(classification_run / "checkpoint-2", folder / "checkpoint-2")
    argv = ["--model_dir", str(folder), "--repo_id", "someone/seqbert-rt", "--private", "--revision", "dev"]
    with record_hub_requests() as hub:
        status = push_to_hub.main(argv)
    assert status == 0
    assert hub.created_repos == [{"repo_id": "someone/seqbert-rt", "repo_type": "model", "private": True}]
    assert [b["branch"] for b in hub.created_branches] == ["dev"]
    upload, card = hub.commits
    # Exactly the files of the folder (sizes from disk), minus checkpoints and pickles; weights go through LFS.
    on_disk = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and not p.relative_to(folder).as_posix().startswith("checkpoint-") and p.suffix != ".bin"
    }
    assert upload["files"] == on_disk == dict(upload_files(folder))
    assert upload["revision"] == "dev" and "model.safetensors" in upload["lfs_files"]
    assert "training_args.bin" not in upload["files"] and "training_args.bin" in UPLOAD_IGNORE_PATTERNS
    # The second commit re-renders the card: repository id and the sha of the upload commit in the loading snippet.
    assert set(card["files"]) == {"README.md"} and card["revision"] == "dev"
    text = card["contents"]["README.md"].decode()
    assert 'repo_id = "someone/seqbert-rt"' in text and f'revision = "{upload["oid"]}"' in text
    assert ModelCard(text).data.to_dict()["library_name"] == "transformers"
    out = capsys.readouterr().out
    assert upload["oid"] in out and "AutoModelForSequenceClassification.from_pretrained" in out


def test_tokenizer_round_trip_of_the_main_job_folder(classification_run, minilm_path, rt_texts):
    """The pushed tokenizer is the base model's: same ids on real text."""
    saved = AutoTokenizer.from_pretrained(classification_run)
    original = AutoTokenizer.from_pretrained(minilm_path)
    assert saved(rt_texts[:16])["input_ids"] == original(rt_texts[:16])["input_ids"]


def test_saved_code_needs_only_torch_and_transformers(tmp_path):
    """transformers' remote-code loader refuses a modeling file that imports a package the user lacks (it scans the
    import statements). The saved files import only torch, transformers (with its own dependency safetensors) and the
    standard library: no peft, sentence-transformers or seqbert."""
    seqbert.SeqBertForSequenceClassification(tiny_config(num_labels=2)).save_pretrained(tmp_path)
    for name in CODE_FILES:
        imports = set(get_imports(tmp_path / name)) - set(sys.stdlib_module_names)
        assert imports <= {"torch", "transformers", "safetensors"}, (name, imports)
