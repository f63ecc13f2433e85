"""The example scripts on bad input: a missing or empty data file, a column the data lacks, a maximum length beyond the
model's learned positions, FSDP asked for on the CPU (in transformers 5's form, `--fsdp` with `--fsdp_config`, and in
the older string form while transformers takes it). Each must stop with exit status 2 and a one-line message naming
the argument and its value (no traceback), before anything is written to `--output_dir`.

Every case goes through each script's `main`, which raises `ScriptInputError`; one case per script (two for
`run_classification.py`) also runs as the command users type (the script run as `__main__`: its exit status, the one
line on stderr, the output folder). Those run in the one subprocess that also prints every script's `--help`
(`script_runs`: one torch and transformers import, about 7 s, instead of one per command); they stop before any model
is loaded, and the line they print is `run_cli`'s, the same for every case (tested directly below)."""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import pythonbible as bible
import run_classification  # noqa: E402
import run_mlm  # noqa: E402
import run_seq2seq  # noqa: E402
import transformers
from conftest import ROOT, SCRIPT_PATHS
from transformers import BertConfig, TrainingArguments

import seqbert
from seqbert.data import rotten_tomatoes_path
from seqbert.script_utils import ScriptInputError, check_data_file, check_max_length, position_limit, run_cli


MARKER = "written before the run\n"


@dataclass(frozen=True)
class Case:
    """A command line with one bad argument; `{data}` in `args` and `value` stands for the `data_dir` folder."""

    script: str
    problem: str
    args: tuple[str, ...]
    argument: str  # the message must name it ...
    value: str  # ... and its value
    existing_output: bool = False  # the output folder exists (with a marker file) before the run
    command_line: bool = False  # also run as a command, in a subprocess (one case per script)

    @property
    def id(self) -> str:
        return f"{self.script.removeprefix('run_').removesuffix('.py')}-{self.problem}"


REVIEWS = ("--train_file", "{data}/reviews.csv", "--validation_file", "{data}/reviews.csv")
PAIRS = ("--train_file", "{data}/pairs.jsonl", "--test_file", "{data}/pairs.jsonl")
VERSES = ("--train_file", "{data}/verses.txt", "--validation_file", "{data}/verses.txt")

CASES = [
    Case(
        "run_classification.py", "missing-file",
        ("--train_file", "{data}/nonexistent.csv", "--validation_file", "{data}/reviews.csv"),
        "train_file", "{data}/nonexistent.csv",
    ),
    Case(
        "run_classification.py", "empty-file",
        ("--train_file", "{data}/header_only.csv", "--validation_file", "{data}/reviews.csv"),
        "train_file", "{data}/header_only.csv",
    ),
    Case(
        "run_classification.py", "unknown-column", (*REVIEWS, "--label_column", "nope"), "label_column", "'nope'",
        existing_output=True, command_line=True,
    ),
    Case("run_classification.py", "too-long", ("--max_seq_length", "1024"), "max_seq_length", "1024"),
    Case(
        "run_classification.py", "fsdp-on-cpu", (*REVIEWS, "--fsdp"), "--fsdp was given", "instead of FSDP",
        command_line=True,
    ),
    Case(
        "run_seq2seq.py", "missing-file", (*PAIRS, "--validation_file", "{data}/nonexistent.jsonl"),
        "validation_file", "{data}/nonexistent.jsonl", command_line=True,
    ),
    Case(
        "run_seq2seq.py", "empty-file", ("--train_file", "{data}/no_lines.jsonl", "--test_file", "{data}/pairs.jsonl"),
        "train_file", "{data}/no_lines.jsonl",
    ),
    Case("run_seq2seq.py", "unknown-column", (*PAIRS, "--source_column", "nope"), "source_column", "'nope'"),
    Case("run_seq2seq.py", "too-long", ("--max_source_length", "1024"), "max_source_length", "1024"),
    Case("run_mlm.py", "missing-file", ("--train_file", "{data}/nonexistent.txt"), "train_file", "{data}/nonexistent.txt"),
    Case("run_mlm.py", "empty-file", ("--train_file", "{data}/no_lines.txt"), "train_file", "{data}/no_lines.txt"),
    Case("run_mlm.py", "unknown-column", (*VERSES, "--text_column", "nope"), "text_column", "'nope'"),
    Case("run_mlm.py", "too-long", ("--max_seq_length", "1024"), "max_seq_length", "1024", command_line=True),
]  # fmt: skip
# Cases checked through `main` only (each script's command line runs one of `CASES`).
MAIN_CASES = [
    Case("run_classification.py", "missing-validation-file", (*REVIEWS[:2], "--validation_file", "{data}/nonexistent.csv"), "validation_file", "nonexistent.csv"),
    Case("run_classification.py", "unknown-text-column", (*REVIEWS, "--text_column", "nope"), "text_column", "'nope'"),
    Case("run_classification.py", "no-train-samples", (*REVIEWS, "--max_train_samples", "0"), "max_train_samples", "0"),
    Case("run_classification.py", "no-eval-samples", (*REVIEWS, "--max_eval_samples", "0"), "max_eval_samples", "0"),
    Case("run_seq2seq.py", "unknown-target-column", (*PAIRS, "--target_column", "nope"), "target_column", "'nope'"),
    Case("run_seq2seq.py", "too-long-target", (*PAIRS, "--max_target_length", "1024"), "max_target_length", "1024"),
    Case("run_seq2seq.py", "too-long-generation", (*PAIRS, "--generation_max_length", "600"), "generation_max_length", "600"),
    Case("run_seq2seq.py", "no-train-samples", (*PAIRS, "--max_train_samples", "0"), "max_train_samples", "0"),
    Case("run_seq2seq.py", "no-decoder-layers", (*PAIRS, "--num_decoder_layers", "0"), "num_decoder_layers", "0"),
    Case("run_seq2seq.py", "test-file-without-rows", (*PAIRS[:2], "--test_file", "{data}/header_only.csv"), "test_file", "header_only.csv"),
    Case("run_seq2seq.py", "no-test-file", ("--train_file", "{data}/pairs.jsonl"), "do_predict", "test"),
    Case("run_mlm.py", "train-file-without-rows", ("--train_file", "{data}/header_only.csv"), "train_file", "header_only.csv"),
    Case("run_mlm.py", "missing-validation-file", ("--validation_file", "{data}/nonexistent.jsonl"), "validation_file", "nonexistent.jsonl"),
    Case("run_mlm.py", "no-full-block", (*VERSES, "--max_seq_length", "512"), "max_seq_length", "512"),  # 8 verses fill no block of 512
    Case("run_mlm.py", "no-train-samples", ("--max_train_samples", "0"), "max_train_samples", "0"),
    Case("run_mlm.py", "fsdp-on-cpu", ("--fsdp",), "--fsdp was given", "instead of FSDP"),
    Case("run_seq2seq.py", "fsdp-config-on-cpu", (*PAIRS, "--fsdp", "--fsdp_config", "{data}/fsdp_config.json"), "--fsdp was given", "instead of FSDP"),
    Case("run_mlm.py", "beyond-learned-positions", ("--config_overrides", "max_position_embeddings=64", "--max_seq_length", "65"), "max_seq_length", "65"),
]  # fmt: skip
COMMAND_LINE_CASES = [case for case in CASES if case.command_line]
SCRIPT_MODULES = {"run_classification.py": run_classification, "run_seq2seq.py": run_seq2seq, "run_mlm.py": run_mlm}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Small real data files (Rotten Tomatoes snippets, Genesis verse pairs and text) and empty ones."""
    folder = tmp_path_factory.mktemp("data")
    reviews = pd.read_csv(rotten_tomatoes_path())
    reviews = reviews[reviews.category.isin(["fresh", "rotten"])].head(8)
    reviews.rename(columns={"category": "label"})[["text", "label"]].to_csv(folder / "reviews.csv", index=False)
    (folder / "header_only.csv").write_text("text,label\n")
    verse_ids = [bible.get_verse_id(bible.Book.GENESIS, 1, verse) for verse in range(1, 9)]
    pairs = pd.DataFrame(
        {
            "source": [bible.get_verse_text(v, version=bible.Version.KING_JAMES) for v in verse_ids],
            "target": [bible.get_verse_text(v, version=bible.Version.WORLD_ENGLISH) for v in verse_ids],
        }
    )
    pairs.to_json(folder / "pairs.jsonl", orient="records", lines=True)
    (folder / "verses.txt").write_text("\n".join(pairs.source) + "\n")
    (folder / "no_lines.jsonl").write_text("")
    (folder / "no_lines.txt").write_text("")
    (folder / "fsdp_config.json").write_text(json.dumps({"version": 2, "reshard_after_forward": True}))
    return folder


def command_line(case: Case, data_dir: Path, root: Path) -> tuple[list[str], Path]:
    """The command line of `case` (script path first) and the `--output_dir` it is given, under `root`; the output
    folder and its marker are made here where the case says it exists."""
    output_dir = root / case.id / "output"
    if case.existing_output:
        output_dir.mkdir(parents=True)
        (output_dir / "marker.txt").write_text(MARKER)
    argv = [
        str(SCRIPT_PATHS[case.script]), *(arg.format(data=data_dir) for arg in case.args),
        "--output_dir", str(output_dir), "--cache_dir", str(root / case.id / "cache"),
    ]  # fmt: skip
    return argv, output_dir


@pytest.mark.parametrize("case", COMMAND_LINE_CASES, ids=lambda case: case.id)
def test_bad_input_stops_with_a_one_line_message_before_writing_output(case, script_runs, data_dir):
    code, _, stderr, output_dir = script_runs[case.id]
    report = f"exit status {code}\nstderr:\n{stderr[-4000:]}"
    assert code == 2, report
    assert "Traceback" not in stderr, report
    errors = [line for line in stderr.splitlines() if line.startswith(f"{case.script}: error: ")]
    assert len(errors) == 1, report
    assert case.argument in errors[0] and case.value.format(data=data_dir) in errors[0], report
    if case.existing_output:
        assert [path.name for path in output_dir.iterdir()] == ["marker.txt"]
        assert (output_dir / "marker.txt").read_text() == MARKER
    else:
        assert not output_dir.exists()


@pytest.mark.parametrize("case", CASES + MAIN_CASES, ids=lambda case: case.id)
def test_every_case_raises_a_script_input_error_from_main_before_writing_output(case, data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(
        "FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False
    )  # what transformers sets for --fsdp: undone after
    output_dir = tmp_path / "output"
    if case.existing_output:
        output_dir.mkdir()
        (output_dir / "marker.txt").write_text(MARKER)
    argv = [arg.format(data=data_dir) for arg in case.args]
    with pytest.raises(ScriptInputError) as error:
        SCRIPT_MODULES[case.script].main(
            [*argv, "--output_dir", str(output_dir), "--cache_dir", str(tmp_path / "cache")]
        )
    assert case.argument in str(error.value) and case.value.format(data=data_dir) in str(error.value)
    if case.existing_output:
        assert [path.name for path in output_dir.iterdir()] == ["marker.txt"]
        assert (output_dir / "marker.txt").read_text() == MARKER
    else:
        assert not output_dir.exists()


def test_fsdp_in_its_older_string_form_and_from_an_accelerate_config_is_refused_on_cpu(data_dir, tmp_path, monkeypatch):
    """`--fsdp full_shard`, the string form transformers 5.24 still takes (with a deprecation warning, moving it into
    `fsdp_config`), and an accelerate FSDP config (`ACCELERATE_USE_FSDP=true`) are refused on the CPU as `--fsdp` is,
    before anything is written; the string form as long as transformers takes it."""
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    output_dir = tmp_path / "output"
    arguments = ["--train_file", str(data_dir / "reviews.csv"), "--validation_file", str(data_dir / "reviews.csv")]
    arguments += ["--output_dir", str(output_dir), "--cache_dir", str(tmp_path / "cache")]
    try:
        TrainingArguments(output_dir=str(tmp_path / "probe"), fsdp="full_shard")
    except (TypeError, ValueError) as error:
        pytest.skip(f"transformers {transformers.__version__} no longer takes fsdp='full_shard': {error}")
    with pytest.raises(ScriptInputError, match=r"^--fsdp was given, but accelerate set up NO instead of FSDP"):
        run_classification.main([*arguments, "--fsdp", "full_shard"])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ScriptInputError, match=r"^an accelerate FSDP config \(ACCELERATE_USE_FSDP=true\) was given"):
        run_classification.main(arguments)
    assert not output_dir.exists()


def test_position_limit_binds_learned_positions_only():
    assert position_limit(BertConfig(max_position_embeddings=128)) == 128
    assert position_limit(seqbert.SeqBertConfig(max_position_embeddings=64)) == 64
    sinusoidal = seqbert.SeqBertConfig(max_position_embeddings=64, position_embedding_type="sinusoidal")
    assert position_limit(sinusoidal) is None
    check_max_length("max_seq_length", 4096, sinusoidal, "tiny")  # no limit: no error
    check_max_length("max_seq_length", 64, seqbert.SeqBertConfig(max_position_embeddings=64), "tiny")
    with pytest.raises(ScriptInputError, match=r"max_seq_length \(65\) must be at most 64"):
        check_max_length("max_seq_length", 65, seqbert.SeqBertConfig(max_position_embeddings=64), "tiny")


def test_check_data_file_names_the_argument_for_a_folder_and_an_empty_file(tmp_path):
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(ScriptInputError, match="train_file .*folder.csv.* is not a file"):
        check_data_file("train_file", str(tmp_path / "folder.csv"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ScriptInputError, match="validation_file .*empty.jsonl.* is empty"):
        check_data_file("validation_file", str(tmp_path / "empty.jsonl"))
    (tmp_path / "one.jsonl").write_text('{"text": "a"}\n')
    check_data_file("validation_file", str(tmp_path / "one.jsonl"))


def test_run_cli_prints_input_errors_as_one_line_and_lets_other_errors_through(capsys):
    parser = argparse.ArgumentParser(prog="demo.py")

    def bad_input():
        raise ScriptInputError("max_seq_length (1024) must be at most 512")

    with pytest.raises(SystemExit) as exit_info:
        run_cli(bad_input, parser)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "demo.py: error: max_seq_length (1024) must be at most 512\n"

    def bug():
        raise ValueError("not an input error")

    with pytest.raises(ValueError, match="not an input error"):
        run_cli(bug, parser)


SCRIPTS_WITH_HELP = sorted(
    path.name
    for path in SCRIPT_PATHS.values()
    if path.name != "load_without_seqbert.py"  # a test helper
    and 'if __name__ == "__main__":' in path.read_text()  # not the modules scripts import (benchmark_engines.py)
)


@pytest.mark.parametrize("name", SCRIPTS_WITH_HELP)
def test_every_script_says_what_it_does_and_how_long_it_takes(name):
    """The first paragraph of each script's docstring is the start of its --help (`script_parser`): it must say how
    long the default run takes."""
    source = SCRIPT_PATHS[name].read_text()
    first = ast.get_docstring(ast.parse(source)).split("\n\n")[0]
    assert re.search(r"\d+(\.\d+)? (minute|second)s?|seconds", first), first
    assert "script_parser(" in source


# Runs each command as `python SCRIPT ARGS` does (`runpy`, as `__main__`, its own folder first on sys.path, Python's
# default handling of an uncaught exception: a traceback on stderr and status 1), one after the other in one subprocess:
# one interpreter start and one torch / transformers import instead of one per command.
SCRIPT_RUNNER = """
import contextlib, io, json, os, runpy, sys, traceback
results = {}
for key, argv in json.loads(sys.argv[1]).items():
    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_path, sys.argv = list(sys.path), argv
    sys.path.insert(0, os.path.dirname(argv[0]))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            code = 1
            traceback.print_exc()
    sys.path[:] = saved_path
    results[key] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def script_runs(data_dir, tmp_path_factory) -> dict:
    """`--help` of every script (name -> (exit status, stdout, stderr)) and the command-line cases (case id -> (exit
    status, stdout, stderr, --output_dir)), all in one subprocess (`SCRIPT_RUNNER`), offline, from the repository
    root as users run them."""
    root = tmp_path_factory.mktemp("cli")
    commands = {name: [str(SCRIPT_PATHS[name]), "--help"] for name in SCRIPTS_WITH_HELP}
    output_dirs = {}
    for case in COMMAND_LINE_CASES:
        commands[case.id], output_dirs[case.id] = command_line(case, data_dir, root)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT_RUNNER, json.dumps(commands)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.splitlines()[-1])
    return {key: (*run, output_dirs[key]) if key in output_dirs else tuple(run) for key, run in runs.items()}


@pytest.mark.parametrize("name", SCRIPTS_WITH_HELP)
def test_every_script_prints_its_help(name, script_runs):
    """argparse %-formats each help text: a bare % in one (check_memory_growth.py had one) broke --help."""
    code, stdout, stderr = script_runs[name]
    assert code == 0, stderr
    assert stdout.startswith("usage: ")


@pytest.mark.parametrize("name", ["run_classification.py", "run_seq2seq.py"])
def test_help_starts_with_the_description(name, script_runs):
    code, stdout, _ = script_runs[name]
    lines = stdout.splitlines()
    assert code == 0 and lines[0].endswith("[--option value ...]")
    assert "takes about" in " ".join(lines[1:5])


def test_num_decoder_layers_only_shapes_a_warm_start_from_bert():
    run_seq2seq.check_num_decoder_layers(None, "seqbert", "runs/kjv2web")
    run_seq2seq.check_num_decoder_layers(3, "bert", "bert-base-uncased")
    with pytest.raises(
        ScriptInputError, match=r"num_decoder_layers \(3\) only applies .*'runs/kjv2web' is a 'seqbert'"
    ):
        run_seq2seq.check_num_decoder_layers(3, "seqbert", "runs/kjv2web")


def test_cross_attention_source_only_shapes_a_warm_start_from_bert(seq2seq_run, tmp_path):
    output_dir = tmp_path / "out"
    with pytest.raises(
        ScriptInputError, match=r"cross_attention_source \('last_layer'\) only applies .* is a 'seqbert' checkpoint"
    ):
        run_seq2seq.main(
            [
                "--model_name_or_path",
                str(seq2seq_run),
                "--cross_attention_source",
                "last_layer",
                "--output_dir",
                str(output_dir),
            ]
        )
    assert not output_dir.exists()
