"""Fuzz test (hypothesis) of the example scripts' command lines: `run_classification.py`, `run_mlm.py` and
`run_seq2seq.py` given random values for their own arguments and for the `TrainingArguments` users set most (numbers
out of range or not numbers, empty or random text, missing, empty or odd files and folders, checkpoints that are not
checkpoints, unknown options). Everything a script checks before it loads data (`parse_and_check`) runs in-process.

Each command line must either be accepted, or stop with argparse's usage error (`SystemExit(2)`) or a
`ScriptInputError` whose one-line message names one of the script's arguments; never another exception (a deep torch
or transformers error) and never a file written. The long campaign runs it with tests/test_fuzz.py (README, "Testing").
"""

import dataclasses
from pathlib import Path

import huggingface_hub
import pytest
import run_classification  # noqa: E402
import run_mlm  # noqa: E402
import run_seq2seq  # noqa: E402
from conftest import fuzz_examples
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from transformers import TrainingArguments

from seqbert.script_utils import ScriptInputError


pytestmark = pytest.mark.fuzz

SCRIPTS = {"classification": run_classification, "mlm": run_mlm, "seq2seq": run_seq2seq}

# The TrainingArguments fields drawn besides each script's own: the ones its README examples and users set.
TRAINING_FIELDS = (
    "output_dir", "do_train", "do_eval", "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
    "per_device_eval_batch_size", "gradient_accumulation_steps", "warmup_steps", "weight_decay", "save_steps",
    "save_total_limit", "logging_steps", "eval_steps", "seed", "eval_strategy", "save_strategy", "lr_scheduler_type",
    "resume_from_checkpoint", "load_best_model_at_end", "metric_for_best_model", "overwrite_output_dir",
)  # fmt: skip

# Paths relative to the example's folder (made by `make_folder`): a file of each kind the scripts read, a folder, a
# complete and an incomplete checkpoint, and names that do not exist.
PATHS = (
    "reviews.csv", "empty.csv", "header_only.csv", "pairs.jsonl", "verses.txt", "notes.bin", "folder",
    "run/checkpoint-4", "run/checkpoint-9", "missing.csv", "missing", "run",
)  # fmt: skip
UNKNOWN_OPTIONS = ("nope", "d_hidn", "train-file")
WORDS = ("", " ", "text", "label", "source", "target", "nope", "pre", "post", "none", "True", "latest", "é\u0301")
NUMBERS = ("0", "1", "-1", "2", "7", "64", "512", "513", "1e-5", "0.5", "1.5", "-0.1", "nan", "inf", "1e308",
           "9223372036854775808", "", "abc")  # fmt: skip


# Fields of transformers' TrainingArguments; the scripts' own (theirs and their training arguments') are all drawn.
TRANSFORMERS_FIELDS = {field.name for field in dataclasses.fields(TrainingArguments)}


def script_fields(script) -> dict[str, dataclasses.Field]:
    """The fields of `script`'s parser that the fuzz draws: its own arguments and `TRAINING_FIELDS`."""
    fields = {}
    for dataclass_type in script.make_parser().dataclass_types:
        for field in dataclasses.fields(dataclass_type):
            if field.init and (field.name in TRAINING_FIELDS or field.name not in TRANSFORMERS_FIELDS):
                fields[field.name] = field
    return fields


FIELDS = {name: script_fields(script) for name, script in SCRIPTS.items()}
OPTIONS = {name: {f"--{field}" for field in fields} for name, fields in FIELDS.items()}


INTEGERS = ("0", "1", "-1", "2", "7", "64", "512", "513", "100000", "9223372036854775808")
FLOATS = ("0", "0.5", "1", "1.5", "-0.1", "1e-5", "100", "nan", "inf", "-inf", "1e308")
BOOLEANS = ("true", "false", "True", "no", "1")


def kind_of(field: dataclasses.Field) -> str:
    """What values `field` takes on the command line: "int", "float", "bool", "choice" or "str"."""
    if getattr(field.type, "__members__", None) or field.metadata.get("choices"):
        return "choice"
    text = str(field.type)
    for kind in ("bool", "int", "float"):
        if kind in text:
            return kind
    return "str"


@st.composite
def values(draw, field: dataclasses.Field) -> list[str]:
    """The command-line words after `--FIELD`: four times in five a value of the field's type (in range or not),
    else a value of another kind, none (a bare flag) or two."""
    kind = kind_of(field) if draw(st.integers(0, 4)) else draw(st.sampled_from(["any", "bare", "two"]))
    if kind == "int":
        return [draw(st.sampled_from(INTEGERS))]
    if kind == "float":
        return [draw(st.sampled_from(FLOATS))]
    if kind == "bool":
        return [draw(st.sampled_from(BOOLEANS))]
    if kind == "choice":
        choices = getattr(field.type, "__members__", None) or field.metadata["choices"]
        return [str(draw(st.sampled_from([str(choice).lower() for choice in choices])))]
    if kind == "str":
        return [draw(st.one_of(st.sampled_from(WORDS), st.sampled_from(PATHS).map("{dir}/".__add__)))]
    if kind == "bare":
        return []
    if kind == "two":
        return [draw(st.sampled_from(NUMBERS)), draw(st.sampled_from(WORDS))]
    return [draw(st.one_of(st.sampled_from(NUMBERS), st.sampled_from(WORDS), st.text(max_size=12)))]


@st.composite
def command_lines(draw) -> tuple[str, list[str]]:
    """A script and its arguments: up to six fields with drawn values, sometimes an unknown option, and usually an
    `--output_dir` under the example's folder (new, existing, a file, a folder holding an earlier run)."""
    script = draw(st.sampled_from(sorted(SCRIPTS)))
    names = draw(st.lists(st.sampled_from(sorted(FIELDS[script])), max_size=6, unique=True))
    argv = []
    for name in names:
        argv += [f"--{name}", *draw(values(FIELDS[script][name]))]
    if draw(st.booleans()):
        argv += ["--" + draw(st.sampled_from(UNKNOWN_OPTIONS)), "1"]
    if "output_dir" not in names or draw(st.booleans()):
        argv += ["--output_dir", "{dir}/" + draw(st.sampled_from(["out", "folder", "run", "notes.bin", "run/x"]))]
    return script, argv


def make_folder(folder: Path) -> None:
    """The files `PATHS` names, with real content of each kind (plus an earlier run in `run/`)."""
    folder.mkdir()
    (folder / "reviews.csv").write_text("text,label\ngood film,1\nbad film,0\n")
    (folder / "empty.csv").write_text("")
    (folder / "header_only.csv").write_text("text,label\n")
    (folder / "pairs.jsonl").write_text('{"source": "In the beginning", "target": "Au commencement"}\n')
    (folder / "verses.txt").write_text("In the beginning God created the heaven and the earth.\n")
    (folder / "notes.bin").write_bytes(bytes(range(256)))
    (folder / "folder").mkdir()
    (folder / "run" / "checkpoint-4").mkdir(parents=True)
    (folder / "run" / "checkpoint-4" / "trainer_state.json").write_text("{}")
    (folder / "run" / "checkpoint-9").mkdir()  # incomplete: no trainer_state.json, and the newest
    (folder / "run" / "config.json").write_text("{}")


def snapshot(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(folder)), path.stat().st_size) for path in folder.rglob("*"))


@pytest.fixture(scope="module", autouse=True)
def offline():
    """Hub offline mode (huggingface_hub reads HF_HUB_OFFLINE once, at import): a drawn model name such as '0' must
    fail at once as a missing folder, not after minutes of retries towards an unreachable Hub."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def example_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz") / "data"
    make_folder(folder)
    return folder


@settings(
    max_examples=fuzz_examples(60, 5000),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=command_lines())
# Found by the campaign: transformers' TrainingArguments turned an infinite step count into an int (OverflowError).
@example(command=("classification", ["--logging_steps", "inf", "--output_dir", "{dir}/out"]))
@example(command=("mlm", ["--eval_steps", "-inf", "--eval_strategy", "steps", "--output_dir", "{dir}/out"]))
def test_fuzz_script_command_lines(command, example_folder, capsys):
    script, template = command
    argv = [word.replace("{dir}", str(example_folder)) for word in template]
    before = snapshot(example_folder)
    try:
        SCRIPTS[script].parse_and_check(argv)
        event(f"{script}: accepted")
    except SystemExit as error:
        assert error.code == 2, (script, argv, error.code)
        event(f"{script}: argparse usage error")
    except ScriptInputError as error:
        message = str(error)
        assert message and "\n" not in message, (script, argv, message)
        named = [name for name in FIELDS[script] if name in message] or "unrecognized arguments" in message
        assert named, (script, argv, message)
        event(f"{script}: ScriptInputError")
    finally:
        capsys.readouterr()  # argparse's usage errors go to stderr
    assert snapshot(example_folder) == before, (script, argv)
